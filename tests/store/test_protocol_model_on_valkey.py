"""The model check's histories (tools/model.py: interleavings of claims, completions, releases, waits, purges,
crashes, faults and clock skew, checked there for double runs) replayed against the Valkey store's scripts on
real Redis OSS 7 and Valkey 9 servers: each request the explored history made of the DynamoDB store, made of the
Valkey store in the order it landed, must get the same answer (claimed or the same live record; completed or not;
released, left alone or gone; the same reads, single and batched). So every interleaving the model explored on
DynamoDB's conditions holds on the scripts."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from idempotency_layer import codec
from idempotency_layer.config import Attributes
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from tests.store.test_protocol_model_on_dynamodb import sample  # noqa: F401  (the same explored histories)
from tests.store.test_valkey_store import make
from tests.support.memory_dynamodb import CHECK_FAILED
from tests.support.valkey_server import KINDS, Server

_PARSER = DynamoDBStore(None, "model", Attributes(), key_prefix="fn")  # type: ignore[arg-type]  # only its item parser is used


def _record(key: str, item: Any, *, result: bool = True) -> Any:
    if not item:
        return None
    record = _PARSER._record(key, item)
    return record if result else record._replace(result=None)


def _same(record: Any, expected: Any) -> Any:
    """Records compared field by field; a text result as text (DynamoDB's S) and a binary one as bytes."""
    if record is None or expected is None:
        return record is expected
    if expected.result is not None and isinstance(expected.result.data, str) and codec.is_binary(
            expected.result.format):
        expected = expected._replace(result=codec.Encoded(expected.result.format,
                                                          base64.b64decode(expected.result.data)))
    return record == expected


def _value(values: dict[str, Any], name: str) -> Any:
    value = values.get(name)
    return None if value is None else next(iter(value.values()))


def replay(store: Any, operation: str, params: dict[str, Any], outcome: str, reply: Any) -> str:
    """Make the request the history made of DynamoDB of `store` instead, and check the answer; the kind of request."""
    values = params.get("ExpressionAttributeValues", {})
    if operation == "PutItem":
        item = params["Item"]
        key, now_ms = item["id"]["S"], int(values[":now_ms"]["N"])
        fingerprint = item.get("payload_hash", {}).get("S")
        found = store.claim(key, item["owner"]["S"], (now_ms + 0.5) / 1000, int(item["in_progress_until"]["N"]),
                            int(item["expires_at"]["N"]), fingerprint)
        expected = None if outcome == "ok" else _record(key, reply)
        assert _same(found, expected), f"claim: {found} on the server, {expected} in the model"
        return "claim" if outcome == "ok" else "refused claim"
    key = params.get("Key", {}).get("id", {}).get("S")
    if operation == "UpdateItem":
        data = _value(values, ":result")
        if isinstance(data, str) and "B" in values[":result"]:
            data = base64.b64decode(data)
        done = store.complete(key, _value(values, ":me"), codec.Encoded(_value(values, ":fmt"), data),
                              int(_value(values, ":exp")))
        assert done == (outcome == "ok"), f"complete: {done} on the server, {outcome} in the model"
        return "complete"
    if operation == "DeleteItem":
        if "ConditionExpression" not in params:  # the model's purge: the record it read, deleted (the CLI's purge)
            record = store.get(key)
            assert record is not None and store.purge(key, record.status, record.owner), "purge"
            return "purge"
        if params["ConditionExpression"] == "#o = :me":
            released = store.release(key, _value(values, ":me"))
            assert released == (outcome == "ok" or not reply), f"release: {released}, {outcome} in the model"
            return "release"
        purged = store.purge(key, _value(values, ":s"), _value(values, ":o"))
        assert purged == (outcome == "ok"), f"purge: {purged}, {outcome} in the model"
        return "purge"
    if operation == "GetItem":
        peek = "ProjectionExpression" in params
        found = (store.peek if peek else store.get)(key)
        expected = _record(key, (reply or {}).get("Item"), result=not peek)
        if peek and found is not None:
            found = found._replace(result=None)
        assert _same(found, expected), f"read: {found} on the server, {expected} in the model"
        return "read"
    assert operation == "BatchGetItem", operation
    (request,) = params["RequestItems"].values()
    keys = [key["id"]["S"] for key in request["Keys"]]
    records, unprocessed = store.read(keys)
    (items,) = (reply or {}).get("Responses", {}).values() or [[]]
    expected = {item["id"]["S"]: item for item in items}
    got = {key: (r.status, r.expires_at, r.fingerprint) for key, r in records.items()}
    want = {key: (r.status, r.expires_at, r.fingerprint) for key, r in
            ((key, _record(key, item, result=False)) for key, item in expected.items())}
    assert unprocessed == [] and got == want, f"batch read: {got} on the server, {want} in the model"
    return "batch read"


@pytest.mark.parametrize("kind", KINDS)
def test_the_scripts_answer_every_explored_history_as_the_model_table_does(
        kind: str, valkey_servers: dict[str, Server], sample: list) -> None:  # noqa: F811
    server = valkey_servers[kind]
    store = make(server.port)
    kinds: dict[str, int] = {}
    for history in sample:
        server.command("FLUSHALL")
        for (operation, params, outcome), reply in zip(history.requests, history.replies, strict=True):
            if outcome not in ("ok", CHECK_FAILED):
                continue
            what = replay(store, operation, params, outcome, reply)
            kinds[what] = kinds.get(what, 0) + 1
    assert len(sample) >= 250
    for what in ("claim", "refused claim", "complete", "release", "read", "batch read", "purge"):
        assert kinds.get(what, 0) >= 5, f"the sample should exercise {what}: {kinds}"
    print(f"\n  {sum(kinds.values())} requests of {len(sample)} explored histories answered alike by the "
          f"{kind} scripts: {kinds}")
