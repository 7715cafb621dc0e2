"""The record protocol on Valkey / Redis OSS (ElastiCache, MemoryDB): claim, complete, release, get.

A record is one hash under its key (so one hash slot in cluster mode), with the fields

    s  INPROGRESS | COMPLETED        e  expires at (epoch s)        u  claim lasts until (epoch ms)
    o  owner token                   h  payload fingerprint         f  result format    r  result
    mac  a completed record's MAC (IDEMPOTENCY_RECORD_MAC_KEY), set with its status

Every write is one Lua script, run atomically by the server, and every write after a claim is conditioned on
the owner token, as the DynamoDB store's condition expressions are. A claim takes a record over only when the
script, reading it in the same atomic step, finds it expired by its own times against the caller's clock (the
DynamoDB condition, word for word); the key's server-side expiry (EXPIRE, `CLEANUP_MARGIN_S` after the record
expires) only cleans up. The scripts call EXISTS, HMGET, HGETALL, HGET, HSET, HDEL, DEL and EXPIRE on their one
key: an ACL user needs those and EVALSHA, EVAL and INFO (docs/valkey.md).
"""

from __future__ import annotations

import hashlib
import logging
import time

from ... import codec
from ...errors import IdempotencyConfigurationError, IdempotencyPersistenceLayerError
from ...log import fields
from ..protocol import COMPLETED, INPROGRESS, READ_KEYS, Record
from .client import Client, ValkeyError

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ...deadline import Deadline

_logger = logging.getLogger("idempotency_layer")

# The server deletes a record's key this long after the record expires by its own time. Given as a duration (EXPIRE),
# counted on the server's clock from when it runs the script, so a server clock ahead of the functions' does not
# delete a live record early; the record is judged by its own times.
CLEANUP_MARGIN_S = 300

# ARGV: owner, now (s), now (ms), claim until (ms), expires at (s), fingerprint or "", cleanup in (s).
# The DynamoDB store's condition: nothing there, or expired (e < now), or an in-progress claim that ended.
# A script is not rolled back when a command in it is refused (an ACL): each script's writes are ordered so that a
# refusal leaves no record without its expiry. EXPIRE goes first (on a key about to be replaced, or none: checked
# all the same), the new record is one HSET, and a completion sets its status last.
CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  local r = redis.call('HMGET', KEYS[1], 's', 'e', 'u')
  local e, u = tonumber(r[2]), tonumber(r[3])
  local expired = (e ~= nil and e < tonumber(ARGV[2])) or (r[1] == 'INPROGRESS' and u ~= nil and u < tonumber(ARGV[3]))
  if not expired then return redis.call('HGETALL', KEYS[1]) end
end
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('DEL', KEYS[1])
local fields = {'s', 'INPROGRESS', 'e', ARGV[5], 'u', ARGV[4], 'o', ARGV[1]}
if ARGV[6] ~= '' then fields[9], fields[10] = 'h', ARGV[6] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ARGV[7])
return 0
"""
# ARGV: owner, expires at (s), format, "1" with a result or "0", the result, cleanup in (s), the MAC or "".
COMPLETE = """
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
redis.call('EXPIRE', KEYS[1], ARGV[6])
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'r', ARGV[5]) else redis.call('HDEL', KEYS[1], 'r') end
local done = {'s', 'COMPLETED', 'e', ARGV[2], 'f', ARGV[3]}
if ARGV[7] ~= '' then done[7], done[8] = 'mac', ARGV[7] end
redis.call('HSET', KEYS[1], unpack(done))
return 1
"""
# ARGV: owner. 1: deleted; 2: nothing there (gone already); 0: another owner's record, left alone.
RELEASE = """
if redis.call('HGET', KEYS[1], 'o') == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return 2
"""
# ARGV: status, owner or "" (a record without one). The CLI's purge: only the record an operator was shown.
PURGE = """
local r = redis.call('HMGET', KEYS[1], 's', 'o')
if r[1] == ARGV[1] and ((ARGV[2] == '' and not r[2]) or r[2] == ARGV[2]) then
  redis.call('DEL', KEYS[1]) return 1
end
return 0
"""
_PEEK = ("s", "e", "u", "o", "h")
# Error answers that say a command did not run: the server refused it before running it (rights, memory, a node
# that cannot serve now, a redirection), or the key holds another type. Any other error answer to a write script
# is not one the layer's scripts give (they raise nothing after a write), so the write may have landed.
_NOT_RUN = frozenset({"NOPERM", "NOAUTH", "WRONGPASS", "OOM", "WRONGTYPE", "BUSY", "LOADING", "TRYAGAIN",
                      "CLUSTERDOWN", "MASTERDOWN", "READONLY", "MOVED", "ASK", "CROSSSLOT", "NOREPLICAS",
                      "NOSCRIPT", "SECRET"})
_READ = ("s", "e", "h")
_READ_WHOLE = ("s", "e", "h", "o", "f", "r", "mac")  # what a record's MAC covers too


class Script:
    """A Lua script run by its SHA-1 (EVALSHA), loaded the first time a server does not know it."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()  # the server's name for it

    def run(self, client: Client, key: str, args: list[Any], deadline: Deadline | None) -> Any:
        try:
            return client.command(key, "EVALSHA", self.sha, 1, key, *args, deadline=deadline)
        except ValkeyError as error:
            if error.code != "NOSCRIPT":
                raise
        # A restart or failover forgot it: EVAL sends and caches it (never sent twice: NOSCRIPT ran nothing).
        return client.command(key, "EVAL", self.source, 1, key, *args, deadline=deadline)


_CLAIM, _COMPLETE, _RELEASE, _PURGE = Script(CLAIM), Script(COMPLETE), Script(RELEASE), Script(PURGE)


def _text(value: Any) -> str | None:
    return None if value is None else value.decode() if isinstance(value, bytes) else str(value)


class ValkeyStore:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.name = client.endpoint
        self.where = f"Valkey {client.endpoint}"
        self.read_grant = "the hmget command (+hmget)"
        # Its database, not its endpoint: an endpoint may be renamed (or reached by another name) and keep its data.
        self.identity = f"valkey:{client.url.db}"
        self._unverified: str | None = None

    # -- the server --------------------------------------------------------------------------------------

    def verify(self, deadline: Deadline | None = None) -> None:
        """Check that the server keeps what it is given: every primary's `maxmemory-policy` must be `noeviction`
        (an evicting policy drops records under memory pressure: a claim or a result lost is a second run). In
        cluster mode every primary of CLUSTER SLOTS is asked (and the slots learnt). A definite answer raises
        `IdempotencyConfigurationError`; a server that cannot be reached now is checked before the first claim."""
        try:
            for node, policy in self.policies(deadline).items():
                if policy != "noeviction":
                    where = f"{self.name}" + ("" if node == self.client.seed else f", node {node[0]}:{node[1]}")
                    raise IdempotencyConfigurationError(
                        f"IDEMPOTENCY_VALKEY_URL ({where}): the server's maxmemory-policy is {policy!r}; it must be "
                        "'noeviction', or records (claims, results) may be evicted under memory pressure and the "
                        "handler run twice (set it in the cluster's parameter group)"
                    )
        except ValkeyError as error:
            if error.code == "SECRET":
                raise IdempotencyConfigurationError(f"IDEMPOTENCY_VALKEY_SECRET: {error}") from None
            if error.code is not None and not error.uncertain:
                said = ("refused the credentials" if error.code in ("WRONGPASS", "NOAUTH") else
                        f"refused the user SELECT {self.client.url.db}, the database the URL names: give the ACL "
                        "user +select too, or leave the database out of the URL (docs/valkey.md: Permissions)"
                        if error.step == "SELECT" and error.code == "NOPERM" else
                        f"refused SELECT {self.client.url.db}, the database the URL names: name one the server has "
                        "(from 0 to its databases setting less one), or leave it out of the URL"
                        if error.step == "SELECT" else
                        "refused the user INFO or CLUSTER SLOTS, which the layer needs to check its eviction policy "
                        "(docs/valkey.md: Permissions)" if error.code == "NOPERM" else
                        "refused the layer's check of its eviction policy")
                raise IdempotencyConfigurationError(f"IDEMPOTENCY_VALKEY_URL ({self.name}): the server {said} "
                                                    f"({error})") from None
            self._unverified = str(error)
            _logger.warning("the Valkey server %s could not be reached to check its eviction policy (%s); checked "
                            "again before the first claim", self.name, error)
            return
        self._unverified = None

    def info(self, section: str) -> dict[str, str]:
        """The fields of `INFO section` (the server's, in cluster mode the seed's): what doctor reports of it."""
        return _info(self.client.command(None, "INFO", section))

    def policies(self, deadline: Deadline | None = None) -> dict[tuple[str, int], str | None]:
        """Each primary's `maxmemory-policy` (`INFO memory`): the server's, or in cluster mode every primary's."""
        client = self.client
        cluster = _info(client.command(None, "INFO", "cluster", deadline=deadline)).get("cluster_enabled") == "1"
        nodes = client.discover(deadline) if cluster else [client.seed]
        return {node: _info(client.command(None, "INFO", "memory", deadline=deadline, node=node)).get(
            "maxmemory_policy") for node in nodes}

    def _call(self, what: str, key: str | None, run: Any, count: int = 1, write: bool = False) -> Any:
        """`run()`, its failures as the store's error. `write`: a script that writes (claim, complete, release), whose
        refusal is taken for "it did not run" only when the server's code says so (`_NOT_RUN`): any other error
        answer is not one the layer's scripts give, so the write may have landed (uncertain: a claim is withdrawn)."""
        subject = f"key {key!r}" if key is not None else f"{count} keys"
        try:
            return run()
        except ValkeyError as error:
            # A refusal of the user's rights is permanent (no retry grants them); one key's odd value is not.
            denied = error.code == "NOPERM" or _script_denied(str(error))
            uncertain = error.uncertain or (write and error.code is not None and error.code not in _NOT_RUN)
            raise IdempotencyPersistenceLayerError(
                f"Valkey {what} on {self.name} failed for {subject}: {error}",
                permanent=denied or error.code in ("NOAUTH", "WRONGPASS"),
                uncertain=uncertain, denied=denied,
            ) from error
        except Exception as error:  # nothing of the client's should escape; if it does, it may have been sent
            raise IdempotencyPersistenceLayerError(
                f"Valkey {what} on {self.name} failed for {subject}: {type(error).__name__}", uncertain=True
            ) from error

    def _record(self, key: str, fields_: dict[str, Any], *, with_result: bool = True) -> Record:
        """The record in a hash's fields. A hash that is not one of the layer's records is refused, never
        replayed."""
        try:
            status = _text(fields_["s"])
            if status not in (INPROGRESS, COMPLETED):
                raise ValueError("status")
            until = fields_.get("u")
            result = None
            form = _text(fields_.get("f"))
            if with_result and status == COMPLETED and form is None:
                raise ValueError("a completed record without its result's format")  # the complete script writes one
            if with_result and form is not None:
                data = fields_.get("r")
                if data is not None and not codec.is_binary(form):
                    data = data.decode()
                result = codec.Encoded(form, data)
            return Record(key=key, status=status, expires_at=int(fields_["e"]),
                          in_progress_until=None if until is None else int(until), owner=_text(fields_.get("o")),
                          result=result, fingerprint=_text(fields_.get("h")), mac=_text(fields_.get("mac")))
        except (KeyError, TypeError, ValueError, UnicodeDecodeError):
            raise IdempotencyPersistenceLayerError(
                f"Valkey {self.name} holds under key {key!r} a value that is not an idempotency record (fields s, e "
                "missing or of the wrong type); the handler did not run"
            ) from None

    def _check_first(self, deadline: Deadline | None) -> None:
        if self._unverified is None:
            return
        try:
            self.verify(deadline)
        except IdempotencyConfigurationError as error:  # within an invocation: the store cannot be used (HTTP: 503)
            raise IdempotencyPersistenceLayerError(f"{error}; the handler did not run", permanent=True) from None
        if self._unverified is not None:
            raise IdempotencyPersistenceLayerError(
                f"the Valkey server {self.name} could not be reached to check its eviction policy "
                f"({self._unverified}); the handler did not run"
            )

    # -- the protocol -----------------------------------------------------------------------------------

    def claim(self, key: str, owner: str, now: float, in_progress_until: int, expires_at: int,
              fingerprint: str | None = None, deadline: Deadline | None = None) -> Record | None:
        self._check_first(deadline)
        args = [owner, int(now), int(now * 1000), in_progress_until, expires_at, fingerprint or "",
                _cleanup_in(expires_at, now)]
        answer = self._call("claim", key, lambda: _CLAIM.run(self.client, key, args, deadline), write=True)
        if answer == 0:
            return None
        try:
            return self._record(key, _pairs(answer))
        except IdempotencyPersistenceLayerError as error:
            # Not the record the script answers a live one with: the claim may have landed all the same, so it is
            # uncertain, and the cycle withdraws it (under this owner token: nothing of anyone else's is deleted).
            raise IdempotencyPersistenceLayerError(str(error), uncertain=True) from None

    def complete(self, key: str, owner: str, result: codec.Encoded, expires_at: int,
                 deadline: Deadline | None = None, seal: Callable[[codec.Encoded], str] | None = None) -> bool:
        data = result.data
        args = [owner, expires_at, result.format, "0" if data is None else "1", b"" if data is None else data,
                _cleanup_in(expires_at, time.time()), "" if seal is None else seal(result)]
        answer = self._call("complete", key, lambda: _COMPLETE.run(self.client, key, args, deadline), write=True)
        return bool(_expected(answer, (0, 1), "complete", key))

    def release(self, key: str, owner: str, deadline: Deadline | None = None) -> bool:
        answer = _expected(self._call("release", key, lambda: _RELEASE.run(self.client, key, [owner], deadline),
                                      write=True), (0, 1, 2), "release", key)
        if answer == 2:
            # Nothing there: our own release already landed (sent again after a lost answer), or it expired.
            _logger.info("claim on key %r was already gone at release", key, extra=fields(key, "released"))
        return bool(answer)

    def purge(self, key: str, status: str, owner: str | None) -> bool:
        """Delete the record of `key` if it still has the `status` and `owner` an operator was shown."""
        return bool(self._call("purge", key, lambda: _PURGE.run(self.client, key, [status, owner or ""], None)))

    def get(self, key: str, deadline: Deadline | None = None) -> Record | None:
        answer = self._call("HGETALL", key, lambda: self.client.command(key, "HGETALL", key, deadline=deadline))
        return self._record(key, _pairs(answer)) if answer else None

    def peek(self, key: str, deadline: Deadline | None = None) -> Record | None:
        # Never the result, which may be large.
        answer = self._call("HMGET", key, lambda: self.client.command(key, "HMGET", key, *_PEEK, deadline=deadline))
        return self._fields(key, _PEEK, answer, with_result=False)

    def _fields(self, key: str, names: tuple[str, ...], answer: Any, *, with_result: bool) -> Record | None:
        if not isinstance(answer, list) or len(answer) != len(names):
            raise IdempotencyPersistenceLayerError(f"Valkey {self.name} answered HMGET for key {key!r} in another "
                                                   "shape")
        found = {name: value for name, value in zip(names, answer, strict=True) if value is not None}
        return self._record(key, found, with_result=with_result) if found else None

    def read(self, keys: list[str], deadline: Deadline | None = None, whole: bool = False
             ) -> tuple[dict[str, Record], list[str]]:
        """The records of `keys` without results, one pipelined request per node; a key whose node moved, or whose
        value is not a record, is left to its claim (unprocessed, or absent)."""
        if not 0 < len(keys) <= READ_KEYS:
            raise ValueError(f"a read takes 1 to {READ_KEYS} keys, not {len(keys)}")
        by_node: dict[tuple[str, int], list[str]] = {}
        for key in keys:
            by_node.setdefault(self.client.node(key), []).append(key)
        records: dict[str, Record] = {}
        unprocessed: list[str] = []
        names = _READ_WHOLE if whole else _READ
        for node, group in by_node.items():
            commands = [("HMGET", key, *names) for key in group]
            answers = self._call("HMGET", None, lambda commands=commands, node=node: self.client.pipeline(
                commands, deadline, node), len(group))
            for key, answer in zip(group, answers, strict=True):
                if isinstance(answer, ValkeyError):
                    if answer.code in ("MOVED", "ASK"):
                        unprocessed.append(key)  # its claim goes to the right node; and so does the next read
                        if answer.code == "MOVED":
                            self.client.learn(str(answer))
                    continue
                try:
                    record = self._fields(key, names, answer, with_result=whole)
                except IdempotencyPersistenceLayerError:
                    continue  # not a record: the claim judges it
                if record is not None:
                    records[key] = record
        return records, unprocessed


def _cleanup_in(expires_at: int, now: float) -> int:
    return max(1, expires_at - int(now) + CLEANUP_MARGIN_S)


def _script_denied(text: str) -> bool:
    """Whether a refusal is an ACL's of a command a script calls (Redis OSS 7 and Valkey word it with ERR)."""
    return "no permissions to run" in text or "can't run this command" in text or "ACL failure" in text


def _expected(answer: Any, answers: tuple[int, ...], what: str, key: str) -> int:
    """`answer` when it is one of the script's `answers`; else the write's outcome is unknown (uncertain)."""
    if type(answer) is not int or answer not in answers:
        raise IdempotencyPersistenceLayerError(f"Valkey answered {what} for key {key!r} with something its script "
                                               "never answers; it may have run", uncertain=True)
    return answer


def _pairs(answer: Any) -> dict[str, Any]:
    if not isinstance(answer, list) or len(answer) % 2:
        # An answer no script of ours gives: a broken server or a middlebox. What ran is unknown (a claim may
        # have landed): uncertain, so the cycle withdraws it.
        raise IdempotencyPersistenceLayerError("Valkey answered in a shape that is not a record's fields",
                                               uncertain=True)
    return {_text(answer[i]) or "": answer[i + 1] for i in range(0, len(answer), 2)}


def _info(answer: Any) -> dict[str, str]:
    text = answer.decode() if isinstance(answer, bytes) else str(answer)
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}
