"""Where the layer's hot path spends its CPU: cProfile, timed by `time.process_time`, in a worker process.

    run.py --profile    (or: python bench/profile_hot.py TABLE  with the worker's environment)

Profiles the lean transport's first executions and replays (small result), after a warm-up, and reports the
functions with the most own time, per invocation. cProfile's own overhead inflates every figure; the ranking is
what to read.
"""

from __future__ import annotations

import contextlib
import cProfile
import json
import math
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import BENCH, Context, base_env, event, python

INVOCATIONS = 200
TOP = 12
# Where the time goes, by the cumulative time of these functions: (label, file suffix, function name).
BUCKETS = (
    ("HTTP round trip (urllib3 urlopen, CPU only)", "urllib3/connectionpool.py", "urlopen"),
    ("  of which response headers (http.client parse_headers)", "http/client.py", "parse_headers"),
    ("SigV4 signing (add_auth)", "botocore/auth.py", "add_auth"),
    ("AWSRequest construction", "botocore/awsrequest.py", "__init__"),
    ("request body (orjson.dumps)", "~", "<orjson.dumps>"),
    ("response body (orjson.loads)", "~", "<orjson.loads>"),
    ("result encoding (codec.encode)", "idempotency_layer/codec.py", "encode"),
    ("result decoding (codec.decode)", "idempotency_layer/codec.py", "decode"),
    ("key derivation (KeyDeriver.key)", "idempotency_layer/keys.py", "key"),
    ("the handler itself", "bench_handler.py", "handler"),
)


def _name(key: tuple[str, int, str]) -> str:
    filename, line, function = key
    for marker in ("site-packages/", "/layer/", "/lib/python3"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{function} ({filename}:{line})" if line else function


def _buckets(stats: pstats.Stats, invocations: int) -> list[dict[str, Any]]:
    found = []
    table = stats.stats  # type: ignore[attr-defined]
    total = max(cumulative for (_, _, function), (_, _, _, cumulative, _) in table.items()
                if function == "handler") * 1000 / invocations
    found.append({"part": "whole invocation (interceptor handler, profiled)", "ms": total})
    for label, suffix, name in BUCKETS:
        ms = sum(cumulative for (filename, _, function), (_, _, _, cumulative, _) in table.items()
                 if function == name and filename.endswith(suffix)) * 1000 / invocations
        found.append({"part": label, "ms": ms})
    return found


def _top(profiler: cProfile.Profile, invocations: int) -> dict[str, Any]:
    stats = pstats.Stats(profiler)
    rows = []
    for key, (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": _name(key), "calls": calls // invocations if calls >= invocations else calls,
                     "own_ms": own * 1000 / invocations, "cum_ms": cumulative * 1000 / invocations})
    rows.sort(key=lambda r: -r["own_ms"])
    return {"buckets": _buckets(stats, invocations), "top": rows[:TOP]}


def _per_call_ms(function: Any, n: int) -> float:
    """Best of 5 means of `n` calls, in CPU ms: the least disturbed estimate on a shared machine."""
    best = math.inf
    for _ in range(5):
        start = time.process_time()
        for _ in range(n):
            function()
        best = min(best, (time.process_time() - start) / n * 1000)
    return best


def _components(table: str) -> list[dict[str, Any]]:
    """The hot path's parts timed on their own, without a profiler (which inflates many-small-call code most)."""
    import bench_handler

    from idempotency_layer import codec, interceptor

    transport = interceptor.handler.cycle.store.transport
    from idempotency_layer.keys import KeyDeriver

    config = interceptor.CONFIG
    keys = KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath)  # as build() makes it
    small = bench_handler.handler(event("parts", 0), None)
    large = bench_handler.handler(event("parts", 0, "100k"), None)
    small_encoded, large_encoded = codec.encode(small), codec.encode(large)
    body = b'{"TableName":"%s","Key":{"id":{"S":"bench#missing"}}}' % table.encode()

    from idempotency_layer.dynamodb import DynamoDBError, retry, wire
    from idempotency_layer.dynamodb.client import Client

    if not isinstance(transport, Client) or transport.target.source != "environment":
        raise RuntimeError(f"the bench's layer should run the lean client on the environment's target, not {transport}")
    base = {"Content-Type": "application/x-amz-json-1.0", "Host": transport._host,
            "X-Amz-Target": "DynamoDB_20120810.GetItem"}
    signer = transport._signer("GetItem", None)

    def signed() -> dict:
        return signer.sign(base, body)

    headers = signed()
    sender = transport.pool
    encode_body = wire.encode_body

    fresh = iter(range(10**9))
    claim_body = {"TableName": table, "Item": {"id": {"S": "bench#parts-existing"}, "n": {"N": "1"}},
                  "ConditionExpression": "attribute_not_exists(#k)", "ExpressionAttributeNames": {"#k": "id"},
                  "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
    transport.call("PutItem", {"TableName": table, "Item": {"id": {"S": "bench#parts-existing"}}})

    def failed_claim() -> None:
        with contextlib.suppress(DynamoDBError):
            transport.call("PutItem", claim_body)

    def new_put() -> None:
        transport.call("PutItem", {"TableName": table, "Item": {"id": {"S": f"bench#parts-{next(fresh)}"}}})

    failed = sender.send({**headers, "X-Amz-Target": "DynamoDB_20120810.PutItem"}, encode_body(claim_body))
    decider = retry.Retry(3)

    def retry_decision() -> None:
        decider.capacity = 500  # a fresh quota each time, so every call takes the whole decision
        code, _ = wire.parse_error(failed.status, failed.body)
        decider.delay("PutItem", 1, status=failed.status, code=code, headers=failed.headers)

    def whole(kind: str) -> Any:
        counter = iter(range(10**9))
        if kind == "first":
            return lambda: interceptor.handler(event("parts-first", next(counter)), Context())
        interceptor.handler(event("parts-replay", 0), Context())
        return lambda: interceptor.handler(event("parts-replay", 0), Context())

    parts = [
        ("whole first execution, back to back (not in lockstep)", whole("first"), 200),
        ("whole replay, back to back (not in lockstep)", whole("replay"), 200),
        ("transport.call, PutItem that succeeds", new_put, 300),
        ("transport.call, conditional PutItem that fails with ALL_OLD (a replay's claim)", failed_claim, 300),
        ("  of which error parsing + retry decision (wire.parse_error, retry.Retry)",
         retry_decision, 2000),
        ("key derivation (KeyDeriver.key)", lambda: keys.key(event("parts", 1)), 2000),
        ("owner token (os.urandom(16).hex())", lambda: os.urandom(16).hex(), 5000),
        ("codec.encode, small result", lambda: codec.encode(small), 5000),
        ("codec.encode, 100 KB result (orjson + zlib level 1)", lambda: codec.encode(large), 50),
        ("codec.decode, small result", lambda: codec.decode(small_encoded), 5000),
        ("codec.decode, 100 KB result", lambda: codec.decode(large_encoded), 50),
        ("SigV4 (sigv4.Signer), one request", signed, 2000),
        ("HTTP round trip, one request (connection.Pool.send, already signed)",
         lambda: sender.send(headers, body), 300),
        ("whole transport.call, one GetItem (sign + send + parse + retry bookkeeping)",
         lambda: transport.call("GetItem", {"TableName": table, "Key": {"id": {"S": "bench#missing"}}}), 300),
    ]
    return [{"part": name, "ms": _per_call_ms(function, n)} for name, function, n in parts]


def _child(table: str) -> None:
    from worker import build

    handler = build("layer", table)
    context = Context()
    for i in range(30):  # warm-up: connection, caches
        handler(event("prof-warm", i), context)
        handler(event("prof-warm", i), context)
    out = {}
    for name, namespace, size in (("first execution", "prof", "small"), ("replay", "prof", "small"),
                                  ("first execution, 100 KB result", "prof100k", "100k"),
                                  ("replay, 100 KB result", "prof100k", "100k")):
        events = [event(namespace, i, size) for i in range(INVOCATIONS)]
        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
        for ev in events:
            handler(ev, context)
        profiler.disable()
        out[name] = _top(profiler, INVOCATIONS)
    print(json.dumps({"cprofile": out, "components": _components(table)}), flush=True)


def profile(endpoint: str, tables: dict[str, str], tmp: Path) -> dict[str, Any]:
    env = base_env(endpoint)
    done = subprocess.run([python(), str(BENCH / "profile_hot.py"), tables["layer"]], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    _child(sys.argv[1])
    sys.stdout.flush()
    os._exit(0)
