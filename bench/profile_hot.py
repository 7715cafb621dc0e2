"""Where the layer's hot path spends its CPU, in a worker process, three ways.

    run.py              (or: python bench/profile_hot.py TABLE  with the worker's environment)

1. In place (`IN_PLACE`): the parts that run (the HTTP round trip, http.client's header parser, SigV4, the wire
   protocol, key derivation, the codec) each wrapped in a CPU timer while real first executions and replays run;
   the rest is the cycle/store glue. These are the figures docs/performance.md quotes.
2. cProfile of first executions and replays (small and 100 KB results): the functions with the most own time.
   Its overhead inflates every figure; the ranking is what to read.
3. Parts timed alone, warm (`_components`): a lower bound, as the caches are hot (2-3x below in place for the
   request-sized parts).
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
IN_PLACE_INVOCATIONS = 1000
TOP = 12
# Where the time goes, timed in place: (label, module, owner in it or "", attribute, top level). Each is wrapped
# in a timer of CPU time (`time.process_time_ns`) for the run, so it is measured where it runs: right after a
# real round trip, with whatever that left in the caches. "of which" parts run inside the one above them. The
# cycle/store glue is the whole invocation less the top-level parts: the interceptor, plan, cycle, store, record
# parsing, the handler call.
IN_PLACE = (
    ("HTTP round trip (connection.Pool.send, CPU only)", "idempotency_layer.stores.dynamodb.connection", "Pool", "send",
     True),
    ("  of which response headers (http.client.parse_headers)", "http.client", "", "parse_headers", False),
    ("SigV4 signing (sigv4.Signer.sign)", "idempotency_layer.aws.sigv4", "Signer", "sign", True),
    ("request body (wire.encode_body)", "idempotency_layer.stores.dynamodb.wire", "", "encode_body", True),
    ("answer parsing (wire.answer_error)", "idempotency_layer.stores.dynamodb.wire", "", "answer_error", True),
    ("answer parsing (wire.decode_answer)", "idempotency_layer.stores.dynamodb.wire", "", "decode_answer", True),
    ("key derivation (keys.KeyDeriver.key)", "idempotency_layer.keys", "KeyDeriver", "key", True),
    ("result encoding (codec.encode)", "idempotency_layer.codec", "", "encode", True),
    ("result decoding (codec.decode)", "idempotency_layer.codec", "", "decode", True),
)
GLUE = "cycle/store glue (the rest: interceptor, plan, cycle, store, records, the handler)"


def _wrap(totals: dict[str, int], label: str, function: Any) -> Any:
    clock = time.process_time_ns

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return function(*args, **kwargs)
        finally:
            totals[label] += clock() - start

    return timed


def _in_place(handler: Any, events: list[Any], context: Any) -> list[dict[str, Any]]:
    """Per invocation, in microseconds of CPU: the whole call and each part of IN_PLACE, timed where it runs."""
    import importlib

    totals = dict.fromkeys([label for label, *_ in IN_PLACE], 0)
    undo = []
    for label, module_name, owner_name, attribute, _ in IN_PLACE:
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        original = owner.__dict__[attribute] if owner_name else getattr(module, attribute)
        setattr(owner, attribute, _wrap(totals, label, original))
        undo.append((owner, attribute, original))
    whole = 0
    try:
        for ev in events:
            start = time.process_time_ns()
            handler(ev, context)
            whole += time.process_time_ns() - start
    finally:
        for owner, attribute, original in undo:
            setattr(owner, attribute, original)
    n = len(events)
    rows = [{"part": "whole invocation (with these timers)", "us": whole / n / 1000}]
    rows += [{"part": label, "us": totals[label] / n / 1000} for label, *_ in IN_PLACE]
    top = sum(totals[label] for label, *_, top_level in IN_PLACE if top_level)
    rows.append({"part": GLUE, "us": (whole - top) / n / 1000})
    return rows


def _name(key: tuple[str, int, str]) -> str:
    filename, line, function = key
    for marker in ("site-packages/", "/layer/", "/lib/python3"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{function} ({filename}:{line})" if line else function


def _top(profiler: cProfile.Profile, invocations: int) -> dict[str, Any]:
    stats = pstats.Stats(profiler)
    rows = []
    for key, (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": _name(key), "calls": calls // invocations if calls >= invocations else calls,
                     "own_ms": own * 1000 / invocations, "cum_ms": cumulative * 1000 / invocations})
    rows.sort(key=lambda r: -r["own_ms"])
    return {"top": rows[:TOP]}


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
    keyed = event("parts", 1)  # built outside the timed call
    small = bench_handler.handler(event("parts", 0), None)
    large = bench_handler.handler(event("parts", 0, "100k"), None)
    small_encoded, large_encoded = codec.encode(small), codec.encode(large)
    body = b'{"TableName":"%s","Key":{"id":{"S":"bench#missing"}}}' % table.encode()

    from idempotency_layer.stores.dynamodb import DynamoDBError, retry, wire
    from idempotency_layer.stores.dynamodb.client import Client

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
        context = Context()
        if kind == "first":  # the events built before the timed calls: _per_call_ms takes 5 x 200
            events = iter([event("parts-first", i) for i in range(5 * 200)])
            return lambda: interceptor.handler(next(events), context)
        replayed = event("parts-replay", 0)
        interceptor.handler(replayed, context)
        return lambda: interceptor.handler(replayed, context)

    parts = [
        ("whole first execution, back to back (not in lockstep)", whole("first"), 200),
        ("whole replay, back to back (not in lockstep)", whole("replay"), 200),
        ("transport.call, PutItem that succeeds", new_put, 300),
        ("transport.call, conditional PutItem that fails with ALL_OLD (a replay's claim)", failed_claim, 300),
        ("  of which error parsing + retry decision (wire.parse_error, retry.Retry)",
         retry_decision, 2000),
        ("key derivation (KeyDeriver.key)", lambda: keys.key(keyed), 2000),
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


def _child(table: str, in_place_only: bool = False) -> None:
    from worker import build

    handler = build("layer", table)
    context = Context()
    for i in range(30):  # warm-up: connection, caches
        handler(event("prof-warm", i), context)
        handler(event("prof-warm", i), context)
    out = {}
    in_place = {}
    for name, namespace in (("first execution", "place"), ("replay", "place")):
        in_place[name] = _in_place(handler, [event(namespace, i) for i in range(IN_PLACE_INVOCATIONS)], context)
    if in_place_only:
        print(json.dumps({"in_place": in_place}), flush=True)
        return
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
    print(json.dumps({"in_place": in_place, "cprofile": out, "components": _components(table)}), flush=True)


def profile(endpoint: str, tables: dict[str, str], tmp: Path, in_place_only: bool = False) -> dict[str, Any]:
    """The three ways, in a worker process of the layer's on `tables["layer"]`; `in_place_only`: the first."""
    env = base_env(endpoint)
    done = subprocess.run([python(), str(BENCH / "profile_hot.py"), tables["layer"],
                           *(["--in-place"] if in_place_only else [])], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    _child(sys.argv[1], "--in-place" in sys.argv[2:])
    sys.stdout.flush()
    os._exit(0)
