"""The Valkey store's own promises on real servers (the protocol and the cycle run on it through every test that
takes `store`: tests/store/conftest.py): its layout, requests per path, the eviction check, a cluster's slots,
TLS, the deadline, and faults injected between the layer and the server (tests/support/resp_proxy.py).

Executions are counted by the handlers' own side effect; records read with the tests' own client (valkey-py)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Any

import pytest

from idempotency_layer import codec
from idempotency_layer.config import Valkey
from idempotency_layer.cycle import Cycle
from idempotency_layer.deadline import Deadline
from idempotency_layer.errors import IdempotencyConfigurationError, IdempotencyPersistenceLayerError
from idempotency_layer.invocation import Invocation
from idempotency_layer.stores.valkey.client import Client
from idempotency_layer.stores.valkey.store import CLEANUP_MARGIN_S, ValkeyStore
from tests.support.resp_proxy import CUT, DELAY, DROP, REPLACE, STALL, RespProxy
from tests.support.valkey_server import KINDS, Cluster, Server

LONG = 60_000


@pytest.fixture(params=KINDS)
def server(request: pytest.FixtureRequest, valkey_servers: dict[str, Server]) -> Server:
    server = valkey_servers[request.param]
    server.command("FLUSHALL")
    return server


@pytest.fixture
def proxy(server: Server) -> Any:
    proxy = RespProxy(server.port)
    yield proxy
    proxy.close()


def make(port: int, *, tls: bool = False, host: str = "127.0.0.1", attempts: int = 2, read_timeout: float = 5,
         password: str | None = None, username: str | None = None) -> ValkeyStore:
    url = Valkey(tls=tls, host=host, port=port, db=0, username=username, password=password)
    return ValkeyStore(Client(url, connect_timeout=1, read_timeout=read_timeout, max_attempts=attempts))


def raw(server: Server | int, key: str) -> dict[bytes, bytes]:
    import valkey

    client = valkey.Valkey(host="127.0.0.1", port=server if isinstance(server, int) else server.port)
    try:
        return client.hgetall(key)
    finally:
        client.close()


class Handler:
    def __init__(self, result: Any = "done") -> None:
        self.calls = 0
        self.result = result

    def __call__(self) -> Any:
        self.calls += 1
        return self.result


def test_a_record_is_one_hash_that_the_server_deletes_after_it_expires(server: Server) -> None:
    store = make(server.port)
    now = time.time()
    assert store.claim("fn#k", "me", now, int(now * 1000) + 5000, int(now) + 3600, "fp") is None
    fields = raw(server, "fn#k")
    assert fields == {b"s": b"INPROGRESS", b"e": str(int(now) + 3600).encode(),
                      b"u": str(int(now * 1000) + 5000).encode(), b"o": b"me", b"h": b"fp"}
    import valkey

    client = valkey.Valkey(host="127.0.0.1", port=server.port)
    # Cleanup only (the record is judged by e): a duration from now, the margin after the record's own expiry.
    assert 3600 + CLEANUP_MARGIN_S - 2 <= client.ttl("fn#k") <= 3600 + CLEANUP_MARGIN_S
    assert store.complete("fn#k", "me", codec.Encoded("zlib+json", b"\x78\x9c\x00\xff"), int(now) + 7200)
    fields = raw(server, "fn#k")
    assert (fields[b"s"], fields[b"f"], fields[b"r"]) == (b"COMPLETED", b"zlib+json", b"\x78\x9c\x00\xff")
    assert 7200 + CLEANUP_MARGIN_S - 2 <= client.ttl("fn#k") <= 7200 + CLEANUP_MARGIN_S
    client.close()


def test_requests_per_path_and_one_pipelined_read(server: Server, proxy: RespProxy) -> None:
    cycle = Cycle(make(proxy.port), ttl_seconds=3600)
    handler = Handler({"n": 1})
    cycle.run(Invocation(LONG), "fn#warm", handler)  # the scripts loaded
    proxy.reset()
    cycle.run(Invocation(LONG), "fn#k1", handler)
    assert (proxy.commands, proxy.flights) == ({"EVALSHA": 2}, 2)  # claim, complete
    proxy.reset()
    assert cycle.run(Invocation(LONG), "fn#k1", handler).replayed
    assert (proxy.commands, proxy.flights) == ({"EVALSHA": 1}, 1)  # the refused claim carries the record
    proxy.reset()
    records, unprocessed = cycle.store.read([f"fn#k{i}" for i in range(1, 8)])
    assert (proxy.commands, proxy.flights) == ({"HMGET": 7}, 1)  # seven keys, one round trip
    assert list(records) == ["fn#k1"] and unprocessed == [] and handler.calls == 2


def test_a_script_the_server_forgot_is_sent_again_and_runs_once(server: Server, proxy: RespProxy) -> None:
    cycle = Cycle(make(proxy.port), ttl_seconds=3600)
    handler = Handler()
    cycle.run(Invocation(LONG), "fn#a", handler)
    server.command("SCRIPT", "FLUSH")  # a restart or failover forgets the scripts
    proxy.reset()
    cycle.run(Invocation(LONG), "fn#b", handler)
    assert proxy.commands == {"EVALSHA": 2, "EVAL": 2}  # each refused as NOSCRIPT (it ran nothing), then sent
    assert handler.calls == 2 and raw(server, "fn#b")[b"s"] == b"COMPLETED"


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "volatile-ttl", "allkeys-random"])
def test_an_evicting_server_is_refused(policy: str) -> None:
    server = Server("valkey9", policy=policy).start()
    try:
        with pytest.raises(IdempotencyConfigurationError, match=f"maxmemory-policy is '{policy}'"):
            make(server.port).verify(Deadline.after(2))
        make_noeviction = Server("redis7").start()
        make(make_noeviction.port).verify(Deadline.after(2))  # noeviction passes
        make_noeviction.close()
    finally:
        server.close()


def test_a_record_of_another_shape_is_refused_not_replayed(server: Server) -> None:
    server.command("SET", "fn#text", "a string, as Powertools' CachePersistenceLayer stores its records")
    server.command("HSET", "fn#hash", "status", "COMPLETED")
    cycle = Cycle(make(server.port), ttl_seconds=3600)
    handler = Handler()
    with pytest.raises(IdempotencyPersistenceLayerError, match="WRONGTYPE"):
        cycle.run(Invocation(LONG), "fn#text", handler)
    with pytest.raises(IdempotencyPersistenceLayerError, match="not an idempotency record"):
        cycle.run(Invocation(LONG), "fn#hash", handler)
    assert handler.calls == 0


# -- faults between the layer and the server -------------------------------------------------------------------

@pytest.mark.parametrize("fault", [DROP, CUT])
@pytest.mark.parametrize("command_index", [0, 1], ids=["claim", "complete"])
def test_a_lost_answer_or_a_cut_connection_runs_the_handler_once(server: Server, proxy: RespProxy, fault: str,
                                                                 command_index: int) -> None:
    store = make(proxy.port)
    cycle = Cycle(store, ttl_seconds=3600)
    handler = Handler({"paid": True})
    cycle.run(Invocation(LONG), "fn#warm", Handler())
    for _ in range(command_index):
        proxy.script("EVALSHA", "pass")
    proxy.script("EVALSHA", fault)  # the claim's (or completion's) answer lost: resent on a new connection
    first = cycle.run(Invocation(LONG), "fn#order", handler)
    again = cycle.run(Invocation(LONG), "fn#order", handler)
    assert handler.calls == 1 and again.replayed and again.value == first.value == {"paid": True}
    assert raw(server, "fn#order")[b"s"] == b"COMPLETED"


def test_a_lost_claim_answer_with_no_attempt_left_is_withdrawn(server: Server, proxy: RespProxy) -> None:
    cycle = Cycle(make(proxy.port, attempts=1), ttl_seconds=3600)
    handler = Handler()
    cycle.run(Invocation(LONG), "fn#warm", Handler())
    proxy.script("EVALSHA", DROP)  # the claim lands, its answer is lost, no attempt is left
    with pytest.raises(IdempotencyPersistenceLayerError, match="may have run"):
        cycle.run(Invocation(LONG), "fn#order", handler)
    assert handler.calls == 0 and raw(server, "fn#order") == {}  # withdrawn under our owner: the key is free
    cycle.run(Invocation(LONG), "fn#order", handler)
    assert handler.calls == 1


# Answers no script of the layer's gives, each after the command ran on the server (issue 42: arrays 20,000 deep
# escaped as a bare RecursionError and left the claim that ran behind).
BROKEN_ANSWERS = {
    "nested 20,000 deep": b"*1\r\n" * 20_000 + b":0\r\n",
    "nested 9 deep": b"*1\r\n" * 9 + b":0\r\n",
    "a status": b"+OK\r\n",
    "an odd array": b"*1\r\n$1\r\ns\r\n",
    "a number that is none": b":zero\r\n",
    "an unknown type": b"!3\r\nabc\r\n",
    "a negative length": b"$-7\r\n",
    # Well-formed RESP that the claim script never answers (issue 42's hostile round): each may follow a claim that
    # landed, so each is uncertain and withdrawn too.
    "an empty array": b"*0\r\n",
    "a hash that is no record": b"*2\r\n$1\r\nx\r\n$1\r\ny\r\n",
    "a record without its expiry": b"*2\r\n$1\r\ns\r\n$9\r\nCOMPLETED\r\n",
    "a completed record without its result": b"*4\r\n$1\r\ns\r\n$9\r\nCOMPLETED\r\n$1\r\ne\r\n:9999999999\r\n",
    "a status that is an error": b"*4\r\n$1\r\ns\r\n-ERR\r\n$1\r\ne\r\n:5\r\n",
    "an error no script gives": b"-ERR boom\r\n",
}


@pytest.mark.parametrize("broken", list(BROKEN_ANSWERS))
def test_a_claim_answered_out_of_protocol_is_uncertain_and_withdrawn(server: Server, proxy: RespProxy,
                                                                      broken: str) -> None:
    cycle = Cycle(make(proxy.port, attempts=1), ttl_seconds=3600)
    handler = Handler()
    cycle.run(Invocation(LONG), "fn#warm", Handler())
    proxy.replacement = BROKEN_ANSWERS[broken]
    proxy.script("EVALSHA", REPLACE)  # the claim ran on the server; its answer is replaced
    with pytest.raises(IdempotencyPersistenceLayerError) as failed:
        cycle.run(Invocation(LONG), "fn#order", handler)
    assert failed.value.uncertain and handler.calls == 0
    assert raw(server, "fn#order") == {}  # withdrawn under our owner: the key is free
    assert proxy.commands["EVALSHA"] == 4  # warm claim and completion, the claim, its withdrawal
    cycle.run(Invocation(LONG), "fn#order", handler)
    assert handler.calls == 1


@pytest.mark.parametrize("broken", [b"+OK\r\n", b":7\r\n", b"$1\r\n1\r\n"])
def test_a_completion_answered_out_of_protocol_is_not_taken_for_landed(server: Server, proxy: RespProxy,
                                                                        broken: bytes) -> None:
    store = make(proxy.port, attempts=1)
    now = time.time()
    assert store.claim("fn#c", "me", now, int(now * 1000) + 5000, int(now) + 3600) is None
    proxy.replacement = broken
    proxy.script("EVALSHA", REPLACE)
    with pytest.raises(IdempotencyPersistenceLayerError, match="never answers; it may have run") as failed:
        store.complete("fn#c", "me", codec.Encoded("json", "1"), int(now) + 3600)
    assert failed.value.uncertain
    assert store.complete("fn#c", "me", codec.Encoded("json", "1"), int(now) + 3600)  # sent again: it lands


def test_a_server_that_answers_past_the_deadline_gives_up_by_it(server: Server, proxy: RespProxy) -> None:
    cycle = Cycle(make(proxy.port, attempts=3), ttl_seconds=3600)
    handler = Handler()
    cycle.run(Invocation(LONG), "fn#warm", Handler())
    proxy.delay = 5.0
    for _ in range(3):
        proxy.script("EVALSHA", DELAY)
    started = time.monotonic()
    with pytest.raises(IdempotencyPersistenceLayerError):
        cycle.run(Invocation(1500), "fn#slow", handler)  # 1.5 s left: the claim must give up by then
    assert time.monotonic() - started < 1.5 and handler.calls == 0


def test_a_stalled_connection_is_given_up_and_the_next_one_works(server: Server, proxy: RespProxy) -> None:
    cycle = Cycle(make(proxy.port, attempts=1, read_timeout=0.5), ttl_seconds=3600)
    cycle.run(Invocation(LONG), "fn#warm", Handler())
    proxy.script("HGETALL", STALL)
    with pytest.raises(IdempotencyPersistenceLayerError, match=r"TimeoutError|timed out"):
        cycle.store.get("fn#warm", Deadline.after(5))
    assert cycle.store.get("fn#warm", Deadline.after(5)).status == "COMPLETED"  # a new connection


def test_a_restart_that_loses_unsaved_writes_runs_the_handler_again(valkey_servers: dict[str, Server]) -> None:
    """The documented failure mode of a server that acknowledges writes it has not made durable (no append-only
    file, or an ElastiCache failover): what it lost, it forgets."""
    server = Server("redis7").start()
    try:
        cycle = Cycle(make(server.port), ttl_seconds=3600)
        handler = Handler()
        cycle.run(Invocation(LONG), "fn#order", handler)
        server.restart()  # SIGKILL: no save, no append-only file
        cycle.run(Invocation(LONG), "fn#order", handler)
        assert handler.calls == 2
    finally:
        server.close()


def test_a_restart_with_an_fsynced_append_only_file_keeps_the_record() -> None:
    server = Server("valkey9", extra=("--appendonly", "yes", "--appendfsync", "always")).start()
    try:
        cycle = Cycle(make(server.port), ttl_seconds=3600)
        handler = Handler()
        cycle.run(Invocation(LONG), "fn#order", handler)
        server.restart()
        assert cycle.run(Invocation(LONG), "fn#order", handler).replayed
        assert handler.calls == 1
    finally:
        server.close()


# -- cluster mode -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster() -> Any:
    cluster = Cluster().start()
    yield cluster
    cluster.close()


def test_a_cluster_routes_each_key_to_its_slots_node_and_reads_a_batch_per_node(cluster: Cluster) -> None:
    store = make(cluster.nodes[0].port)
    cycle = Cycle(store, ttl_seconds=3600)
    handler = Handler()
    keys = [f"fn#cluster-{i}" for i in range(30)]
    for key in keys:
        cycle.run(Invocation(LONG), key, handler)
    assert handler.calls == 30
    for key in keys:
        assert cycle.run(Invocation(LONG), key, handler).replayed
    assert handler.calls == 30
    on = [sum(1 for key in keys if node.command("EXISTS", key) == b":1\r\n") for node in cluster.nodes]
    assert sum(on) == 30 and all(on)  # spread over the three primaries, each found where it lives
    fresh = make(cluster.nodes[1].port)  # knows no slot yet: its pipelined read meets MOVED for others' keys
    records, unprocessed = fresh.read(keys)
    assert set(records) | set(unprocessed) == set(keys) and unprocessed  # moved keys: left to their claims
    records, unprocessed = fresh.read(keys)  # the slots learnt: one pipeline per node, every key read
    assert set(records) == set(keys) and unprocessed == []


# -- TLS --------------------------------------------------------------------------------------------------------

def _certificates(folder: str) -> tuple[str, str, str]:
    """A CA, and a certificate for localhost it signed (openssl, as Debian ships it)."""
    ca_key, ca, key, csr, cert = (os.path.join(folder, name) for name in
                                  ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    run = lambda *args: subprocess.run(args, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2",
        "-subj", "/CN=test CA")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=localhost")
    extensions = os.path.join(folder, "ext.cnf")
    with open(extensions, "w") as f:
        f.write("subjectAltName=DNS:localhost\n")
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
        "-days", "2", "-extfile", extensions)
    return ca, cert, key


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.support.dynamodb_local import free_port

    folder = str(tmp_path_factory.mktemp("tls"))
    ca, cert, key = _certificates(folder)
    port = free_port()
    server = Server("redis7", extra=("--port", "0", "--tls-port", str(port), "--tls-cert-file", cert,
                                     "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"))
    server.port = port
    server._ready = lambda: _listening(port)  # type: ignore[method-assign]  # PING in plain text cannot reach it
    yield server.start(), ca
    server.close()


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_tls_verifies_the_server_against_aws_ca_bundle_and_never_falls_back(
        tls_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server, ca = tls_server
    monkeypatch.setenv("AWS_CA_BUNDLE", ca)
    store = make(server.port, tls=True, host="localhost")
    store.verify(Deadline.after(5))
    cycle = Cycle(store, ttl_seconds=3600)
    handler = Handler()
    cycle.run(Invocation(LONG), "fn#tls", handler)
    assert cycle.run(Invocation(LONG), "fn#tls", handler).replayed and handler.calls == 1
    # Another name than the certificate's: refused.
    with pytest.raises(IdempotencyPersistenceLayerError, match=r"CERTIFICATE_VERIFY_FAILED|match"):
        Cycle(make(server.port, tls=True, host="127.0.0.1"), ttl_seconds=3600).run(Invocation(LONG), "fn#x", handler)
    # The default trust (certifi's bundle) does not know this CA: refused, never sent in plain text.
    monkeypatch.delenv("AWS_CA_BUNDLE")
    with pytest.raises(IdempotencyPersistenceLayerError, match="CERTIFICATE_VERIFY_FAILED"):
        Cycle(make(server.port, tls=True, host="localhost"), ttl_seconds=3600).run(Invocation(LONG), "fn#y", handler)
    # Plain text to a TLS port: the server's TLS answer is not RESP; nothing runs.
    with pytest.raises(IdempotencyPersistenceLayerError):
        Cycle(make(server.port, host="localhost", attempts=1, read_timeout=1), ttl_seconds=3600).run(
            Invocation(LONG), "fn#z", handler)
    assert handler.calls == 1


# -- concurrency ------------------------------------------------------------------------------------------------

def test_concurrent_copies_run_once(server: Server) -> None:
    store = make(server.port)
    cycle = Cycle(store, ttl_seconds=3600, wait_seconds=10)
    gate = threading.Event()
    calls: list[int] = []

    def handler() -> Any:
        calls.append(1)
        gate.wait(5)
        return {"ok": True}

    outcomes: list[Any] = []

    def copy() -> None:
        try:
            outcomes.append(cycle.run(Invocation(LONG), "fn#race", handler).value)
        except Exception as error:  # in progress, when the wait ends first
            outcomes.append(type(error).__name__)

    threads = [threading.Thread(target=copy) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    gate.set()
    for thread in threads:
        thread.join(20)
    assert len(calls) == 1 and outcomes == [{"ok": True}] * 8


# -- an ACL user ------------------------------------------------------------------------------------------------

ACL = ("resetkeys ~orders#* resetchannels -@all +evalsha +eval +info +cluster|slots +asking +exists +hmget +hgetall "
       "+hget +hset +hdel +del +expire")


def test_the_documented_acl_is_all_the_layer_needs_and_less_is_refused_as_denied(server: Server) -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert f"on {ACL}" in (root / "docs" / "valkey.md").read_text()  # the docs give exactly this one
    server.command("ACL", "SETUSER", "orders-acl", "reset", "on", ">acl-password-1", *ACL.split())
    server.command("ACL", "SETUSER", "orders-less", "reset", "on", ">acl-password-1", "~orders#*", "+evalsha", "+eval",
                   "+info")
    # The documented ACL but EXPIRE: a refusal inside the claim's script, which is not rolled back.
    server.command("ACL", "SETUSER", "orders-noexp", "reset", "on", ">acl-password-1",
                   *[part for part in ACL.split() if part != "+expire"])
    try:
        store = make(server.port, username="orders-acl", password="acl-password-1")
        store.verify(Deadline.after(5))
        cycle = Cycle(store, ttl_seconds=3600, cache_size=4)
        handler = Handler()
        for _ in range(3):  # first run, replay from the claim, replay from the local cache (its read)
            cycle.run(Invocation(LONG), "orders#acl", handler)
        assert handler.calls == 1 and store.read(["orders#acl", "orders#other"])[0]
        assert store.purge("orders#acl", "COMPLETED", store.get("orders#acl").owner)
        with pytest.raises(IdempotencyPersistenceLayerError) as raised:
            Cycle(make(server.port, username="orders-less", password="acl-password-1"), ttl_seconds=3600).run(
                Invocation(LONG), "orders#acl", handler)
        assert raised.value.denied and raised.value.permanent and handler.calls == 1
        with pytest.raises(IdempotencyPersistenceLayerError) as raised:
            Cycle(make(server.port, username="orders-noexp", password="acl-password-1"), ttl_seconds=3600).run(
                Invocation(LONG), "orders#noexp", handler)
        assert raised.value.denied and raw(server, "orders#noexp") == {}  # nothing left without an expiry
    finally:
        server.command("ACL", "DELUSER", "orders-acl", "orders-less", "orders-noexp")


def test_a_database_in_the_url_needs_select_and_init_says_so(server: Server) -> None:
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "valkey.md").read_text()
    assert "add `+select`" in docs and "refused the user SELECT 2, the database the URL names" in docs
    server.command("ACL", "SETUSER", "orders-db", "reset", "on", ">acl-password-1", *ACL.split())
    server.command("ACL", "SETUSER", "orders-db-select", "reset", "on", ">acl-password-1", *ACL.split(), "+select")

    def store(user: str, db: int = 2) -> ValkeyStore:
        url = Valkey(tls=False, host="127.0.0.1", port=server.port, db=db, username=user, password="acl-password-1")
        return ValkeyStore(Client(url, connect_timeout=1, read_timeout=5, max_attempts=2))

    try:
        with pytest.raises(IdempotencyConfigurationError,
                           match=r"refused the user SELECT 2, the database the URL names: give the ACL user "
                                 r"\+select too") as refused:
            store("orders-db").verify(Deadline.after(5))
        assert "INFO" not in str(refused.value).split("(", 1)[0]  # not blamed on INFO / CLUSTER SLOTS
        with pytest.raises(IdempotencyPersistenceLayerError, match=r"\(SELECT\)") as denied:
            Cycle(store("orders-db"), ttl_seconds=3600).run(Invocation(LONG), "orders#db", Handler())
        assert denied.value.denied and denied.value.permanent
        # With +select, a database the server does not have is named as such, not blamed on the grant.
        with pytest.raises(IdempotencyConfigurationError, match=r"refused SELECT 99, the database the URL names: "
                                                                r"name one the server has") as missing:
            store("orders-db-select", 99).verify(Deadline.after(5))
        assert "+select" not in str(missing.value)
        granted = store("orders-db-select")
        granted.verify(Deadline.after(5))
        handler = Handler()
        for _ in range(2):
            Cycle(granted, ttl_seconds=3600).run(Invocation(LONG), "orders#db", handler)
        assert handler.calls == 1 and raw(server, "orders#db") == {}  # not in database 0
        import valkey

        in_two = valkey.Valkey(host="127.0.0.1", port=server.port, db=2)
        try:
            assert in_two.hget("orders#db", "s") == b"COMPLETED"
            in_two.delete("orders#db")
        finally:
            in_two.close()
    finally:
        server.command("ACL", "DELUSER", "orders-db", "orders-db-select")


def test_a_user_without_a_password_is_that_user(server: Server) -> None:
    server.command("ACL", "SETUSER", "orders-nopass", "reset", "on", "nopass", "~orders#*", "+@all")
    try:
        store = make(server.port, username="orders-nopass")
        assert store.client.command(None, "ACL", "WHOAMI") == b"orders-nopass"
        assert store.claim("orders#np", "me", time.time(), int(time.time() * 1000) + 5000, int(time.time()) + 60) \
            is None
    finally:
        server.command("ACL", "DELUSER", "orders-nopass")


def test_a_server_clock_far_ahead_does_not_delete_a_live_record(server: Server) -> None:
    """The server's own expiry is a duration (EXPIRE), not a time on the function's clock."""
    import valkey

    store = make(server.port)
    behind = time.time() - 3600  # the function's clock an hour behind the server's
    assert store.claim("fn#skew", "me", behind, int(behind * 1000) + 60_000, int(behind) + 120) is None
    client = valkey.Valkey(host="127.0.0.1", port=server.port)
    assert 120 + CLEANUP_MARGIN_S - 2 <= client.ttl("fn#skew") <= 120 + CLEANUP_MARGIN_S
    client.close()
    assert store.get("fn#skew") is not None


def test_an_eviction_policy_first_seen_at_a_claim_fails_it_as_a_store_error() -> None:
    """Init could not reach the server; the first claim checks, and fails as the store (HTTP: 503), not as init."""
    lossy = Server("redis7", policy="volatile-lru").start()
    proxy = RespProxy(lossy.port)
    try:
        store = make(proxy.port, attempts=2)
        proxy.script("INFO", CUT)
        proxy.script("INFO", CUT)
        store.verify(Deadline.after(2))  # unreachable: a warning, checked again before the first claim
        handler = Handler()
        with pytest.raises(IdempotencyPersistenceLayerError, match="maxmemory-policy is 'volatile-lru'") as raised:
            Cycle(store, ttl_seconds=3600).run(Invocation(LONG), "fn#k", handler)
        assert raised.value.permanent and handler.calls == 0
    finally:
        proxy.close()
        lossy.close()


def test_every_primary_of_a_cluster_is_checked(cluster: Cluster) -> None:
    third = cluster.nodes[2]
    assert third.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru") == b"+OK\r\n"
    try:
        with pytest.raises(IdempotencyConfigurationError, match=f"node 127.0.0.1:{third.port}.*'allkeys-lru'"):
            make(cluster.nodes[0].port).verify(Deadline.after(5))
    finally:
        third.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
    store = make(cluster.nodes[0].port)
    store.verify(Deadline.after(5))  # and the slots learnt: no MOVED for any key
    assert len(set(store.client.node(f"fn#{i}") for i in range(50))) == 3


def test_a_claim_in_a_migrating_slot_follows_ask_as_the_documented_acl_user(cluster: Cluster) -> None:
    from idempotency_layer.stores.valkey.client import _slot

    key = "orders#ask-1"
    slot = _slot(key)
    ids = {node.port: node.command("CLUSTER", "MYID").split(b"\r\n")[1].decode() for node in cluster.nodes}
    source = next(node for node in cluster.nodes if not node.command("CLUSTER", "COUNTKEYSINSLOT", str(slot))
                  .startswith(b"-") and node.command("GET", key).startswith(b"$"))
    target = next(node for node in cluster.nodes if node is not source)
    for node in cluster.nodes:
        node.command("ACL", "SETUSER", "orders-acl", "reset", "on", ">acl-password-1", *ACL.split())
    try:
        assert target.command("CLUSTER", "SETSLOT", str(slot), "IMPORTING", ids[source.port]) == b"+OK\r\n"
        assert source.command("CLUSTER", "SETSLOT", str(slot), "MIGRATING", ids[target.port]) == b"+OK\r\n"
        handler = Handler()
        cycle = Cycle(make(source.port, username="orders-acl", password="acl-password-1"), ttl_seconds=3600)
        cycle.run(Invocation(LONG), key, handler)  # ASK: the key is new, so the target takes it
        for node in cluster.nodes:  # the migration finished: the slot is the target's everywhere
            node.command("CLUSTER", "SETSLOT", str(slot), "NODE", ids[target.port])
        assert handler.calls == 1 and target.command("EXISTS", key) == b":1\r\n"
        assert cycle.run(Invocation(LONG), key, handler).replayed and handler.calls == 1  # MOVED now
    finally:
        for node in cluster.nodes:
            node.command("CLUSTER", "SETSLOT", str(slot), "NODE", ids[target.port])
            node.command("ACL", "DELUSER", "orders-acl")
