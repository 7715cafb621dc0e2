"""The CLI with the Valkey store (IDEMPOTENCY_STORE=valkey) on real servers, run as a subprocess the way an operator
runs it: `show`, `purge` and `doctor`, exit statuses, one line on stderr for a failure, never the password."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from idempotency_layer.cycle import Cycle
from idempotency_layer.invocation import Invocation
from tests.store.test_valkey_store import make
from tests.support.valkey_server import KINDS, Server

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret-Passw0rd-xyz"


@pytest.fixture(params=KINDS)
def server(request: pytest.FixtureRequest, valkey_servers: dict[str, Server]) -> Server:
    server = valkey_servers[request.param]
    server.command("FLUSHALL")
    return server


def cli_env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IDEMPOTENCY_", "AWS_")) and k != "PYTHONPATH"}
    env.update(IDEMPOTENCY_STORE="valkey", IDEMPOTENCY_VALKEY_URL=url, AWS_LAMBDA_FUNCTION_NAME="orders",
               PYTHONPATH=str(ROOT / "layer"), IDEMPOTENCY_MAX_ATTEMPTS="1", IDEMPOTENCY_CONNECT_TIMEOUT="0.5",
               **extra)
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "idempotency_layer", *args], env=env, capture_output=True,
                          text=True, timeout=60, input="", check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    return done


def test_show_and_purge_a_record_and_the_next_copy_runs_again(server: Server) -> None:
    cycle = Cycle(make(server.port), ttl_seconds=3600)
    calls: list[float] = []
    cycle.run(Invocation(60_000), "orders#k1", lambda: calls.append(time.time()) or {"paid": True})
    env = cli_env(server.url)
    shown = run(env, "show", "orders#k1", "--result")
    assert shown.returncode == 0 and "status:            COMPLETED" in shown.stdout, shown.stdout
    assert 'result value:      {"paid": true}' in shown.stdout
    purged = run(env, "purge", "orders#k1", "--yes")
    assert purged.returncode == 0, purged.stderr
    missing = run(env, "show", "orders#k1")
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"idempotency-layer: no record for key 'orders#k1' in Valkey redis://127.0.0.1:{server.port}"
    cycle.run(Invocation(60_000), "orders#k1", lambda: calls.append(time.time()) or {"paid": True})
    assert len(calls) == 2


def test_purge_refuses_a_live_claim_and_show_refuses_a_value_that_is_not_a_record(server: Server) -> None:
    now = time.time()
    make(server.port).claim("orders#live", "o-1", now, int(now * 1000) + 300_000, int(now) + 3600)
    server.command("SET", "orders#text", "not a record")
    env = cli_env(server.url)
    refused = run(env, "purge", "orders#live", "--yes")
    assert refused.returncode == 1 and "claimed by a live invocation" in refused.stderr
    assert make(server.port).get("orders#live") is not None
    other = run(env, "show", "orders#text")
    assert other.returncode == 1 and len(other.stderr.splitlines()) == 1 and "WRONGTYPE" in other.stderr


def test_doctor_passes_on_a_good_server_and_never_shows_the_password(server: Server) -> None:
    server.command("CONFIG", "SET", "requirepass", PASSWORD)
    try:
        url = f"redis://default:{PASSWORD}@127.0.0.1:{server.port}"
        done = run(cli_env(url), "doctor", "--key-jmespath", "orderId", "--require-key", "true")
        assert done.returncode == 0, done.stdout
        lines = done.stdout.splitlines()
        assert lines[0] == f"PASS settings: valid: store Valkey(redis://default:***@127.0.0.1:{server.port}/0), key " \
                           "prefix 'orders', scope auto"
        for name in ("server", "cluster mode", "eviction", "probe claim", "probe complete", "probe read",
                     "probe release"):
            assert any(line.startswith(f"PASS {name}:") for line in lines), (name, done.stdout)
        assert any(line.startswith("WARN tls: redis://: plain text") for line in lines)
        assert any(line.startswith("WARN durability:") for line in lines)
        wrong = run(cli_env(f"redis://default:wrong-password@127.0.0.1:{server.port}"), "doctor")
        assert wrong.returncode == 1 and "WRONGPASS" in wrong.stdout and "wrong-password" not in wrong.stdout
    finally:
        import valkey

        client = valkey.Valkey(host="127.0.0.1", port=server.port, password=PASSWORD)
        left = client.keys("orders#doctor-probe-*")
        client.config_set("requirepass", "")
        client.close()
    assert left == []  # the probe key released


def test_doctor_names_select_for_an_acl_user_without_it(server: Server) -> None:
    from tests.store.test_valkey_store import ACL

    server.command("ACL", "SETUSER", "orders-db", "reset", "on", f">{PASSWORD}", *ACL.split())
    try:
        done = run(cli_env(f"redis://orders-db:{PASSWORD}@127.0.0.1:{server.port}/2"), "doctor")
        assert done.returncode == 1
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL server:")]
        assert len(failed) == 1 and "refused the user SELECT 2 (the database the URL names)" in failed[0], done.stdout
        assert "grant the user +select too" in done.stdout and "INFO or CLUSTER SLOTS" not in done.stdout
        assert run(cli_env(f"redis://orders-db:{PASSWORD}@127.0.0.1:{server.port}"), "doctor").returncode == 0
    finally:
        server.command("ACL", "DELUSER", "orders-db")


def test_doctor_fails_an_evicting_server_and_one_that_does_not_answer() -> None:
    lossy = Server("redis7", policy="volatile-lru").start()
    try:
        done = run(cli_env(lossy.url), "doctor")
        assert done.returncode == 1
        assert any(line.startswith("FAIL eviction: maxmemory-policy volatile-lru") for line in done.stdout.splitlines())
    finally:
        lossy.close()
    gone = run(cli_env(lossy.url), "doctor")
    assert gone.returncode == 1 and any(line.startswith("FAIL server:") for line in gone.stdout.splitlines())


def test_doctor_checks_and_probes_every_primary_of_a_cluster() -> None:
    from tests.support.valkey_server import Cluster

    cluster = Cluster().start()
    try:
        done = run(cli_env(cluster.url), "doctor")
        lines = done.stdout.splitlines()
        assert done.returncode == 0, done.stdout
        assert "PASS cluster mode: enabled, 3 primaries: commands follow MOVED to the node of each key's slot" in lines
        assert "PASS eviction: maxmemory-policy noeviction on every primary: records are never evicted" in lines
        claims = [line for line in lines if line.startswith("PASS probe claim:")]
        assert sorted(line.rsplit(":", 1)[1] for line in claims) == sorted(str(node.port) for node in cluster.nodes)
        cluster.nodes[1].command("CONFIG", "SET", "maxmemory-policy", "volatile-lru")
        done = run(cli_env(cluster.url), "doctor")
        assert done.returncode == 1
        assert f"FAIL eviction: maxmemory-policy volatile-lru on 127.0.0.1:{cluster.nodes[1].port}: records (claims, " \
               "results) may be evicted under memory pressure and a handler run twice; the layer refuses to start" \
               in done.stdout.splitlines()
    finally:
        cluster.close()


def test_doctor_against_a_replica_stops_at_the_refused_claim(valkey_servers: dict[str, Server]) -> None:
    primary = valkey_servers["valkey9"]
    replica = Server("valkey9", extra=("--replicaof", "127.0.0.1", str(primary.port))).start()
    try:
        done = run(cli_env(replica.url), "doctor")
        probes = [line for line in done.stdout.splitlines() if "probe" in line]
        assert done.returncode == 1 and len(probes) == 1 and probes[0].startswith("FAIL probe claim:"), done.stdout
        assert "the URL names a replica" in done.stdout
    finally:
        replica.close()


def test_key_needs_no_server(tmp_path: Path) -> None:
    event = tmp_path / "event.json"
    event.write_text('{"orderId": "o-1"}')
    env = cli_env("", IDEMPOTENCY_KEY_JMESPATH="orderId")
    del env["IDEMPOTENCY_VALKEY_URL"]
    done = run(env, "key", "--event", str(event))
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith("orders#"), done.stdout + done.stderr
