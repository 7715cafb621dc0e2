"""doctor's checks of a Valkey store (IDEMPOTENCY_STORE=valkey): the server, then the protocol on a probe key.

What the server says of itself (INFO): engine and version, cluster mode, eviction policy, persistence. What only
the deployment knows (MemoryDB or ElastiCache, replicas, Multi-AZ) is not visible through the protocol: the
durability check says which it could not see (docs/valkey.md says what each deployment keeps).
"""

from __future__ import annotations

import os
import time

from ... import codec
from ...errors import IdempotencyPersistenceLayerError
from .check import FAIL, PASS, PROBE_SECONDS, WARN, Check

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

GRANT = "+evalsha +eval +info +cluster|slots +asking +exists +hmget +hgetall +hget +hset +hdel +del +expire"


def checks(config: Any) -> list[Check]:
    """The store the layer would use for `config`, its server's checks, then the probe on each primary."""
    from ...stores.valkey import make_store  # its own store: the checks read its client and policies

    try:
        store = make_store(config)
    except Exception as error:  # the CA bundle unreadable, say
        return [Check("client", FAIL, f"the Valkey client could not be set up: {type(error).__name__}: {error}",
                      "check AWS_CA_BUNDLE and IDEMPOTENCY_VALKEY_URL")]
    try:
        found, nodes = server_checks(store)
        return found + probe_checks(store, config.key_prefix, nodes)
    finally:
        store.client.close()


def server_checks(store: Any) -> tuple[list[Check], list[tuple[str, int]]]:
    """The server's own facts; and the primaries that answered (in cluster mode every primary of CLUSTER SLOTS,
    as the layer's init checks them)."""
    from ...stores.valkey.client import ValkeyError

    rows = []
    url = store.client.url
    if url.tls:
        rows.append(Check("tls", PASS, f"rediss://: TLS, the server's certificate verified for {url.host}"))
    else:
        rows.append(Check("tls", WARN, "redis://: plain text; records and the password cross the network unencrypted",
                          "enable in-transit encryption on the cluster and use rediss://"))
    try:
        server, cluster, persistence = (store.info(name) for name in ("server", "cluster", "persistence"))
        policies = store.policies()
    except ValkeyError as error:
        if error.step == "SELECT":
            said, fix = (f"refused the user SELECT {url.db} (the database the URL names)",
                         "grant the user +select too, or leave the database out of the URL (docs/valkey.md)")
        elif error.code == "NOPERM":
            said, fix = "refused the user INFO or CLUSTER SLOTS", f"grant the user {GRANT} (docs/valkey.md)"
        elif error.code in ("WRONGPASS", "NOAUTH"):
            said, fix = "refused the credentials", "check the user and password (or the secret, or the IAM user)"
        elif error.code == "SECRET":
            said, fix = "could not be connected to", "check IDEMPOTENCY_VALKEY_SECRET and the role's access to it"
        elif error.code is not None:
            said, fix = "refused the layer's check", "see the server's answer"
        else:
            said, fix = "did not answer", ("check the URL, the security group (the function and the cluster in one "
                                           "VPC), TLS (AWS_CA_BUNDLE) and the network")
        rows.append(Check("server", FAIL, f"{store.name} {said}: {error}", fix))
        return rows, []
    engine = "valkey" if server.get("server_name") == "valkey" or "valkey_version" in server else "redis"
    version = server.get("valkey_version") or server.get("redis_version") or "?"
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    rows.append(Check("server", PASS if major >= 7 else WARN, f"{engine} {version} at {store.name}",
                      None if major >= 7 else "the layer is tested on Redis OSS 7 and Valkey 9: upgrade the engine"))
    clustered = cluster.get("cluster_enabled") == "1"
    rows.append(Check("cluster mode", PASS, f"enabled, {len(policies)} primaries: commands follow MOVED to the "
                      "node of each key's slot" if clustered else "disabled (one shard)"))
    lossy = {node: policy for node, policy in policies.items() if policy != "noeviction"}
    if not lossy:
        rows.append(Check("eviction", PASS, "maxmemory-policy noeviction" + (" on every primary" if clustered else "")
                          + ": records are never evicted"))
    for (host, port), policy in lossy.items():
        where = f" on {host}:{port}" if clustered else ""
        rows.append(Check("eviction", FAIL, f"maxmemory-policy {policy}{where}: records (claims, results) may be "
                          "evicted under memory pressure and a handler run twice; the layer refuses to start",
                          "set maxmemory-policy to noeviction in the cluster's parameter group"))
    aof = persistence.get("aof_enabled") == "1"
    rows.append(Check("durability", WARN, (
        "append-only file on" if aof else "no append-only file") + "; whether an acknowledged write survives a "
        "failover depends on the deployment, which the protocol does not show: MemoryDB keeps it (a Multi-AZ "
        "transaction log), ElastiCache replicates asynchronously and may lose it",
        "use MemoryDB for payment flows (docs/valkey.md)"))
    return rows, list(policies)


def _probe_key(store: Any, prefix: str, node: tuple[str, int], primaries: int) -> str:
    """A probe key whose slot `node` serves (any key when there is one node)."""
    for _ in range(100_000):
        key = f"{prefix}#doctor-probe-{os.urandom(8).hex()}"
        if primaries == 1 or store.client.node(key) == node:
            return key
    return key  # (a node serving almost no slot: the probe lands where it lands)


def probe_checks(store: Any, prefix: str, nodes: list[tuple[str, int]]) -> list[Check]:
    """claim, complete, read, release as the layer makes them, on a probe key removed again: one per primary."""
    rows = []
    for node in nodes:
        where = f" on {node[0]}:{node[1]}" if len(nodes) > 1 else ""
        rows += _probe(store, _probe_key(store, prefix, node, len(nodes)), where)
    return rows


def _probe(store: Any, key: str, where: str) -> list[Check]:
    owner = f"doctor-{os.urandom(8).hex()}"
    now = time.time()
    rows = []

    def probe(name: str, action: Any) -> bool:
        try:
            action()
        except IdempotencyPersistenceLayerError as error:
            text = str(error)
            if error.denied:
                fix = f"grant the user the commands the layer sends and its scripts call: {GRANT} (docs/valkey.md)"
            elif "READONLY" in text:
                fix = "the URL names a replica: use the primary (or cluster configuration) endpoint"
            else:
                fix = "retry doctor"
            rows.append(Check(f"probe {name}", FAIL, f"on probe key {key}{where}: {text}", fix))
            return False
        rows.append(Check(f"probe {name}", PASS, f"probe key {key}{where}"))
        return True

    # A step that failed leaves the later ones nothing to prove: they are not run.
    if probe("claim", lambda: store.claim(key, owner, now, int(now * 1000) + PROBE_SECONDS * 1000,
                                          int(now) + PROBE_SECONDS)):
        probe("complete", lambda: store.complete(key, owner, codec.Encoded(codec.DONE, None),
                                                 int(now) + PROBE_SECONDS))
        probe("read", lambda: store.read([key]))
        probe("release", lambda: store.release(key, owner))
    return rows
