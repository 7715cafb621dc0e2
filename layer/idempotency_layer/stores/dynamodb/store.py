"""The record protocol (stores/protocol.py) on DynamoDB: claim, complete, release, get, peek, read, purge.

Expiry is always judged by the condition expressions, never by an item's presence: TTL deletion lags by up
to days, so an expired record may still be there. Every write that follows a claim is conditioned on the
claim's owner token, so an invocation never completes or deletes a claim that another one took over.
"""

from __future__ import annotations

import base64
import binascii
import logging

from ... import codec
from ...config import Attributes
from ...deadline import Deadline
from ...errors import IdempotencyConfigurationError, IdempotencyPersistenceLayerError
from ...log import fields
from ..protocol import COMPLETED, INPROGRESS, READ_KEYS, Record
from . import CHECK_FAILED, DynamoDBError, Transport

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_logger = logging.getLogger("idempotency_layer")

# How DynamoDB words a ValidationException for a key of another shape than the table's (another attribute name or
# type, a sort key too many or too few): the only refusals of the table check that blame the key schema.
_SCHEMA_DIFFERS = ("does not match the schema", "One of the required keys was not given a value",
                   "The number of conditions on the keys is invalid", "Type mismatch for key")
# What the table check reads under the function's prefix: an item that never exists (a record's key ends in 64 hex
# digits), so the answer, not the item, says whether the table has the key schema the settings describe.
SCHEMA_CHECK = "idempotency-layer-schema-check"
# Answers no retry can change: the table, the role or the request is wrong.
_PERMANENT = frozenset({
    "AccessDeniedException", "ResourceNotFoundException", "ValidationException", "UnrecognizedClientException",
    "MissingAuthenticationTokenException", "InvalidSignatureException", "KMSAccessDeniedException",
    "KMSDisabledException", "KMSNotFoundException", "KMSInvalidStateException", "SerializationException",
})


# The attribute a completed record's MAC is stored in (IDEMPOTENCY_RECORD_MAC_KEY); never written without it.
MAC_ATTR = "mac"


def _number(value: dict[str, Any] | None) -> int | None:
    return None if value is None else int(value["N"])


def _blob(value: Any) -> bytes:
    # boto3 hands back bytes, the lean transport the wire's base64 text.
    return value if isinstance(value, bytes) else base64.b64decode(value)


class DynamoDBStore:
    def __init__(
        self, transport: Transport, table: str, attributes: Attributes, partition_value: str | None = None, *,
        key_prefix: str,
    ) -> None:
        """`key_prefix`: the function's key prefix (IDEMPOTENCY_KEY_PREFIX), under which the table check reads too,
        so that a role confined to its own keys (`dynamodb:LeadingKeys` of `<prefix>#*`) may make it."""
        self.transport = transport
        self.table = table
        self.check_key = f"{key_prefix}#{SCHEMA_CHECK}"
        self.name = table
        self.where = f"table {table!r}"
        self.read_grant = f"dynamodb:BatchGetItem on table {table!r}"
        # A table name travels with its items (global tables replicate them under it); the partition value, in the
        # sort-key layout, is part of every record's place.
        self.identity = f"dynamodb:{table}" + ("" if attributes.sort_key is None else f"#{partition_value}")
        self.attr = attributes
        self.partition_value = partition_value
        a = attributes
        self._claim_names = {"#k": a.key, "#s": a.status, "#e": a.expires_at, "#u": a.in_progress_until}
        self._owner_names = {"#o": a.owner}
        self._claim_condition = "attribute_not_exists(#k) OR #e < :now OR (#s = :inprogress AND #u < :now_ms)"
        # Why verify() could not reach the table (the first claim checks again first), or None: it was checked.
        self._unverified: str | None = None

    # -- the table ---------------------------------------------------------------------------------------

    def verify(self, deadline: Deadline | None = None) -> None:
        """Check that the table exists and has the key schema the settings describe, with one GetItem.

        A sort key set on a table without one would otherwise be just another attribute: every key would land
        on one item. A definite answer raises `IdempotencyConfigurationError`; a table that cannot be reached
        now is checked again before the first claim.
        """
        a = self.attr
        try:
            self.transport.call(
                "GetItem", {"TableName": self.table, "Key": self._item_key(self.check_key)},
                deadline,
            )
        except DynamoDBError as error:
            # DynamoDB's own words close every verdict (bounded and cleaned by the client; the request holds no
            # event content), so a refusal this check does not foresee is never dressed as another.
            said = f"(DynamoDB: {error.code}: {error.message})"
            if error.code == "ValidationException" and any(words in error.message for words in _SCHEMA_DIFFERS):
                sort = f"IDEMPOTENCY_SORT_KEY_ATTR={a.sort_key!r}" if a.sort_key else "IDEMPOTENCY_SORT_KEY_ATTR unset"
                raise IdempotencyConfigurationError(
                    f"table {self.table!r} does not have the key these settings describe (IDEMPOTENCY_KEY_ATTR="
                    f"{a.key!r} as a string partition key, {sort}) {said}"
                ) from None
            if error.code == "ValidationException":
                raise IdempotencyConfigurationError(
                    f"IDEMPOTENCY_TABLE={self.table!r}: DynamoDB refused the table check {said}"
                ) from None
            if error.code == "ResourceNotFoundException":
                raise IdempotencyConfigurationError(
                    f"IDEMPOTENCY_TABLE={self.table!r}: no such table in this account and region {said}"
                ) from None
            if error.code in ("AccessDeniedException", "UnrecognizedClientException"):
                raise IdempotencyConfigurationError(
                    f"IDEMPOTENCY_TABLE={self.table!r}: the function's role may not read the table; it needs "
                    f"dynamodb:PutItem, GetItem, UpdateItem and DeleteItem on it, on this function's keys (the check "
                    f"reads key {self.check_key!r}) {said}"
                ) from None
            self._unverified = f"{error.code}: {error.message}"
        except Exception as error:
            # Its message is not shown: it is not DynamoDB's error model, and may say anything.
            self._unverified = type(error).__name__
        else:
            self._unverified = None
        if self._unverified is not None:
            _logger.warning("table %r could not be reached to check its key schema (%s); checked again before the "
                            "first claim", self.table, self._unverified)

    # -- request plumbing -------------------------------------------------------------------------------

    def _item_key(self, key: str) -> dict[str, dict[str, str]]:
        if self.attr.sort_key is None:
            return {self.attr.key: {"S": key}}
        assert self.partition_value is not None
        return {self.attr.key: {"S": self.partition_value}, self.attr.sort_key: {"S": key}}

    def _call(self, operation: str, key: str | None, params: dict[str, Any],
              deadline: Deadline | None = None, count: int = 1) -> dict[str, Any]:
        """`key`: the request's one key, or None for a request of `count` keys (named by their count)."""
        subject = f"key {key!r}" if key is not None else f"{count} keys"
        if key is not None:  # (a request of many keys, BatchGetItem, names its table in RequestItems)
            params["TableName"] = self.table
        try:
            return self.transport.call(operation, params, deadline)
        except DynamoDBError as error:
            if error.code == CHECK_FAILED:
                raise
            raise IdempotencyPersistenceLayerError(
                f"DynamoDB {operation} on table {self.table!r} failed for {subject}: {error.code}: {error.message}",
                permanent=error.code in _PERMANENT, uncertain=error.uncertain,
                denied=error.code == "AccessDeniedException",
            ) from error
        except Exception as error:
            # E.g. a credential refresh that failed outside botocore's own error types.
            raise IdempotencyPersistenceLayerError(
                f"DynamoDB {operation} on table {self.table!r} failed for {subject}: "
                f"{type(error).__name__}: {error}",
                uncertain=True,  # nothing says whether it was sent
            ) from error

    def _record(self, key: str, item: dict[str, Any]) -> Record:
        """The record in `item`, an answer about `key`. An item of another key (a broken proxy or middlebox
        answering another request) or one whose attributes are not the layer's is refused, never replayed."""
        a = self.attr
        try:
            return self._parse(key, item)
        except IdempotencyPersistenceLayerError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error):
            raise IdempotencyPersistenceLayerError(
                f"table {self.table!r} answered for key {key!r} with an item that is not an idempotency record "
                f"(attributes {a.status!r}, {a.expires_at!r}, {a.result_format!r} missing or of the wrong type); "
                "the handler did not run"
            ) from None

    def _parse(self, key: str, item: dict[str, Any]) -> Record:
        a = self.attr
        if not isinstance(item, dict):
            raise TypeError("not an item")
        for name, value in self._item_key(key).items():
            if item.get(name) != value:
                raise IdempotencyPersistenceLayerError(
                    f"table {self.table!r} answered a request for key {key!r} with the item of another key "
                    f"(attribute {name!r} differs); refused rather than replayed, the handler did not run"
                )
        status = item[a.status]["S"]
        if status not in (INPROGRESS, COMPLETED):
            raise ValueError("unknown status")
        result = None
        stored_format = item.get(a.result_format)
        if stored_format is not None:
            form = stored_format["S"]
            stored = item.get(a.result)
            data: Any
            if stored is None:
                data = None
            elif "S" in stored:
                data = stored["S"]
            else:
                data = _blob(stored["B"])
            if not isinstance(form, str) or not isinstance(data, (str, bytes, type(None))):
                raise TypeError("result")
            result = codec.Encoded(form, data)
        owner = item.get(a.owner)
        fingerprint = item.get(a.payload_hash)
        mac = item.get(MAC_ATTR)
        owner = None if owner is None else owner["S"]
        fingerprint = None if fingerprint is None else fingerprint["S"]
        if not isinstance(owner, (str, type(None))) or not isinstance(fingerprint, (str, type(None))):
            raise TypeError("owner or fingerprint")
        if mac is not None:
            mac = mac["S"]
            if not isinstance(mac, str):
                raise TypeError("mac")
        return Record(
            key=key,
            status=status,
            expires_at=int(item[a.expires_at]["N"]),
            in_progress_until=_number(item.get(a.in_progress_until)),
            owner=owner,
            result=result,
            fingerprint=fingerprint,
            mac=mac,
        )

    # -- the protocol -----------------------------------------------------------------------------------

    def claim(self, key: str, owner: str, now: float, in_progress_until: int, expires_at: int,
              fingerprint: str | None = None, deadline: Deadline | None = None) -> Record | None:
        if self._unverified is not None:
            self.verify(deadline)
            if self._unverified is not None:
                raise IdempotencyPersistenceLayerError(
                    f"table {self.table!r} could not be reached to check its key schema ({self._unverified}); the "
                    "handler did not run"
                )
        a = self.attr
        item = self._item_key(key)
        item[a.status] = {"S": INPROGRESS}
        item[a.expires_at] = {"N": str(expires_at)}
        item[a.in_progress_until] = {"N": str(in_progress_until)}
        item[a.owner] = {"S": owner}
        if fingerprint is not None:
            item[a.payload_hash] = {"S": fingerprint}
        params = {
            "Item": item,
            "ConditionExpression": self._claim_condition,
            "ExpressionAttributeNames": self._claim_names,
            "ExpressionAttributeValues": {
                ":now": {"N": str(int(now))},
                ":now_ms": {"N": str(int(now * 1000))},
                ":inprogress": {"S": INPROGRESS},
            },
            # A failed claim carries the live record, so a replay costs one request.
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        try:
            self._call("PutItem", key, params, deadline)
        except DynamoDBError as error:
            if error.item:
                return self._record(key, error.item)
            # A backend that returns no old item on a failed condition: read it.
            record = self.get(key, deadline)
            if record is None:
                raise IdempotencyPersistenceLayerError(
                    f"DynamoDB PutItem on table {self.table!r} failed its condition for key {key!r}, "
                    "but no record is there"
                ) from error
            return record
        return None

    def complete(self, key: str, owner: str, result: codec.Encoded, expires_at: int,
                 deadline: Deadline | None = None, seal: Callable[[codec.Encoded], str] | None = None) -> bool:
        a = self.attr
        names = {"#s": a.status, "#e": a.expires_at, "#o": a.owner, "#f": a.result_format, "#r": a.result}
        values: dict[str, Any] = {
            ":completed": {"S": COMPLETED},
            ":exp": {"N": str(expires_at)},
            ":me": {"S": owner},
            ":fmt": {"S": result.format},
        }
        sets = "SET #s = :completed, #e = :exp, #f = :fmt"
        if seal is not None:
            names["#m"], values[":mac"] = MAC_ATTR, {"S": seal(result)}
            sets += ", #m = :mac"
        if result.data is None:
            update = sets + " REMOVE #r"
        else:
            update = sets + ", #r = :result"
            data = result.data
            if codec.is_binary(result.format):
                values[":result"] = {"B": data if isinstance(data, bytes) else data.encode()}
            else:
                values[":result"] = {"S": data if isinstance(data, str) else data.decode()}
        params = {
            "Key": self._item_key(key),
            "UpdateExpression": update,
            "ConditionExpression": "#o = :me",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
        try:
            self._call("UpdateItem", key, params, deadline)
        except DynamoDBError:
            return False
        except IdempotencyPersistenceLayerError as error:
            cause = error.__cause__
            too_big = isinstance(cause, DynamoDBError) and cause.code == "ValidationException" and (
                "size" in cause.message.lower()
            )
            if result.data is None or not too_big:
                raise
            # Our size estimate was off; completing without the result still keeps the handler from rerunning.
            return self.complete(key, owner, codec.Encoded(codec.TOO_LARGE, None), expires_at, deadline, seal)
        return True

    def release(self, key: str, owner: str, deadline: Deadline | None = None) -> bool:
        params = {
            "Key": self._item_key(key),
            "ConditionExpression": "#o = :me",
            "ExpressionAttributeNames": self._owner_names,
            "ExpressionAttributeValues": {":me": {"S": owner}},
            # What failed the condition tells a record someone else holds from one already gone.
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        try:
            self._call("DeleteItem", key, params, deadline)
        except DynamoDBError as error:
            if error.item is not None:
                return False
            # Nothing there: our own delete already landed (its answer lost, the request sent again after a
            # dropped connection or retried), or the record expired and was removed. Either way not taken over.
            _logger.info("claim on key %r was already gone at release", key, extra=fields(key, "released"))
        return True

    def purge(self, key: str, status: str, owner: str | None) -> bool:
        """Delete the record of `key` if it still has the `status` and `owner` an operator was shown (the CLI's
        purge). False: it changed since, and nothing was deleted."""
        condition, values = "#s = :s AND attribute_not_exists(#o)", {":s": {"S": status}}
        if owner is not None:
            condition, values[":o"] = "#s = :s AND #o = :o", {"S": owner}
        params = {"Key": self._item_key(key), "ConditionExpression": condition,
                  "ExpressionAttributeNames": {"#s": self.attr.status, "#o": self.attr.owner},
                  "ExpressionAttributeValues": values}
        try:
            self._call("DeleteItem", key, params)
        except DynamoDBError as error:
            if error.code != CHECK_FAILED:  # (_call lets only a failed condition through as a DynamoDBError)
                raise
            # Sent again after an attempt that got no answer: that attempt may have deleted it. Gone is deleted.
            return error.uncertain and self.get(key) is None
        return True

    def get(self, key: str, deadline: Deadline | None = None) -> Record | None:
        response = self._call("GetItem", key, {"Key": self._item_key(key), "ConsistentRead": True}, deadline)
        item = response.get("Item")
        return None if item is None else self._record(key, item)

    def peek(self, key: str, deadline: Deadline | None = None) -> Record | None:
        a = self.attr
        # Never the result, which may be large: a read is charged by the whole item, but only this comes back.
        wanted = [a.key, a.status, a.expires_at, a.in_progress_until, a.owner, a.payload_hash]
        wanted += [a.sort_key] if a.sort_key else []
        names = {f"#a{i}": name for i, name in enumerate(wanted)}
        params = {"Key": self._item_key(key), "ConsistentRead": True, "ProjectionExpression": ", ".join(names),
                  "ExpressionAttributeNames": names}
        item = self._call("GetItem", key, params, deadline).get("Item")
        return None if item is None else self._record(key, item)

    def foreign(self, key: str, names: list[str], deadline: Deadline | None = None) -> dict[str, Any] | None:
        """The attributes `names` of another tool's item under partition key `key` in this table (a consistent
        read), as DynamoDB types them, or None: what a migration reads (IDEMPOTENCY_POWERTOOLS_HANDLER)."""
        aliases = {f"#a{i}": name for i, name in enumerate(names)}
        params = {"Key": {self.attr.key: {"S": key}}, "ConsistentRead": True,
                  "ProjectionExpression": ", ".join(aliases), "ExpressionAttributeNames": aliases}
        item = self._call("GetItem", key, params, deadline).get("Item")
        return None if item is None else dict(item)

    def read(self, keys: list[str], deadline: Deadline | None = None, whole: bool = False
             ) -> tuple[dict[str, Record], list[str]]:
        a = self.attr
        if not 0 < len(keys) <= READ_KEYS:
            raise ValueError(f"a read takes 1 to {READ_KEYS} keys, not {len(keys)}")
        # What tells a completed, unexpired record and its fingerprint: never the result, which may be large
        # (an answer holds at most 16 MB; what does not fit comes back as UnprocessedKeys, as do keys a throttled
        # table could not read: https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_BatchGetItem.html)
        # and a batch record does not replay.
        wanted = [a.key, a.status, a.expires_at, a.payload_hash] + ([a.sort_key] if a.sort_key else [])
        if whole:  # what a record's MAC covers: a batch record's result is none, so this adds little
            wanted += [a.owner, a.result_format, a.result, MAC_ATTR]
        names = {f"#a{i}": name for i, name in enumerate(wanted)}
        params = {"RequestItems": {self.table: {
            "Keys": [self._item_key(key) for key in keys],
            "ConsistentRead": True,
            "ProjectionExpression": ", ".join(names),
            "ExpressionAttributeNames": names,
        }}}
        answer = self._call("BatchGetItem", None, params, deadline, len(keys))
        # The stored key names the record: the sort key's value when there is one, else the partition key's.
        named = a.sort_key or a.key
        asked = set(keys)
        try:
            items = answer["Responses"].get(self.table, [])
            left = (answer.get("UnprocessedKeys") or {}).get(self.table, {}).get("Keys", [])
            if not isinstance(items, list) or not isinstance(left, list):
                raise TypeError("not lists")
            unprocessed = [item[named]["S"] for item in left]
            if not all(isinstance(key, str) and key in asked for key in unprocessed):
                raise TypeError("keys not asked for")
        except (KeyError, TypeError, AttributeError):
            raise IdempotencyPersistenceLayerError(
                f"DynamoDB BatchGetItem on table {self.table!r} answered in a shape that is not BatchGetItem's "
                f"for {len(keys)} keys"
            ) from None
        records: dict[str, Record] = {}
        for item in items:
            value = item.get(named) if isinstance(item, dict) else None
            key = value.get("S") if isinstance(value, dict) else None
            if not isinstance(key, str) or key not in asked:
                continue  # not an answer to this read: its key goes to the claim, which reads it itself
            try:
                records[key] = self._parse(key, item)
            except (IdempotencyPersistenceLayerError, KeyError, TypeError, ValueError, AttributeError,
                    binascii.Error):
                continue  # not an idempotency record, or not this key's: the claim judges it
        return records, unprocessed
