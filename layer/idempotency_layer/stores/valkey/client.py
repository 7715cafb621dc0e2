"""Commands to a Valkey or Redis OSS server (standalone or cluster mode), within a deadline.

`resp.Connection` speaks the protocol (why our own: its docstring). This module decides the rest, each in one
place:

    command(key, ...)  ->  node for key's slot  ->  attempt  ->  answer
                               ^    MOVED / ASK: |       | a connection error, LOADING, TRYAGAIN, CLUSTERDOWN,
                               +-- that node ----+       | MASTERDOWN, READONLY: backoff, attempt again
                                                         | while attempts and the deadline allow

- The deadline rule: an attempt's connect and socket timeouts are what `Deadline.attempt_time` allows (at most
  IDEMPOTENCY_CONNECT_TIMEOUT / IDEMPOTENCY_READ_TIMEOUT); no backoff runs past the deadline.
- The retry rule: IDEMPOTENCY_MAX_ATTEMPTS attempts in all. Every command the store sends may be sent again:
  its scripts are conditioned on the owner token, and a claim sent twice finds its own owner.
- Cluster mode: a MOVED answer names the node that serves the slot, remembered for the slot; ASK is followed once.
- TLS (rediss://): the context DynamoDB's client uses (`aws.trust`: AWS_CA_BUNDLE, else certifi's bundle),
  host name checked; never plain text.
- The error model: `ValkeyError(message, uncertain)`; `uncertain`: the command may have run (sent, no answer).
"""

from __future__ import annotations

import os
import random
import threading
import time

from ...deadline import Deadline
from ...errors import IdempotencyConfigurationError
from .resp import Connection, ServerError

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

    from ...config import Valkey

_REDIRECTS = 5  # MOVED / ASK answers followed for one command before giving up
_FIRST_BACKOFF_S, _LAST_BACKOFF_S = 0.025, 0.4
# Answers that say the node cannot serve now, but may soon (a failover, a resharding, a load after restart).
_BUSY = ("LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY")


class ValkeyError(Exception):
    """A command failed. `uncertain`: it was sent and may have run. `code`: the server's error word (WRONGTYPE,
    NOSCRIPT, NOPERM...), or None for a connection failure."""

    def __init__(self, message: str, *, uncertain: bool = False, code: str | None = None,
                 step: str | None = None) -> None:
        super().__init__(message)
        self.uncertain = uncertain
        self.code = code
        self.step = step  # refused while connecting: AUTH or SELECT; None: the command itself


class Client:
    def __init__(self, url: Valkey, *, connect_timeout: float, read_timeout: float, max_attempts: int,
                 auth: Any = None) -> None:
        """`auth`: what new connections authenticate with (`auth.Auth`); None: the URL's user and password."""
        self.url = url
        self.auth = auth
        self.seed = (url.host, url.port)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_attempts = max_attempts
        context = None
        if url.tls:
            from ...aws.environment import ca_bundle
            from ...aws.trust import tls_context

            cafile = ca_bundle(os.environ)
            try:
                context = tls_context(cafile)
            except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
                raise IdempotencyConfigurationError(
                    f"the Valkey store's TLS cannot load the CA bundle {cafile} (AWS_CA_BUNDLE): "
                    f"{type(error).__name__}: {error}"
                ) from None
        self._tls = context
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[Any]] = {}
        self._slots: dict[int, tuple[str, int]] = {}  # learnt from MOVED answers

    @property
    def endpoint(self) -> str:
        host = f"[{self.url.host}]" if ":" in self.url.host else self.url.host
        return f"{'rediss' if self.url.tls else 'redis'}://{host}:{self.url.port}"

    # -- connections -------------------------------------------------------------------------------------

    def _take(self, node: tuple[str, int], seconds: float) -> Any:
        """An idle connection to `node` still fit for use, else a new one (authenticated, its database chosen)."""
        while True:
            with self._lock:
                idle = self._idle.get(node)
                conn = idle.pop() if idle else None
            if conn is None:
                break
            if not conn.stale():  # closed by the server while idle, or holding an answer nobody asked for
                conn.bound(min(self.read_timeout, seconds))
                return conn
            conn.close()
        conn = Connection(node[0], node[1], min(self.connect_timeout, seconds), self._tls)
        try:
            conn.bound(min(self.read_timeout, seconds))
            u = self.url
            user, password = self.auth.credentials() if self.auth is not None else (u.username, u.password)
            if password is not None or user is not None:  # a user without a password: one with `nopass`
                _setup(conn, "AUTH", ("AUTH", user, password or "") if user else ("AUTH", password))
            if u.db:
                _setup(conn, "SELECT", ("SELECT", u.db))
        except BaseException:
            conn.close()
            raise
        return conn

    def _give(self, node: tuple[str, int], conn: Any) -> None:
        with self._lock:
            self._idle.setdefault(node, []).append(conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    # -- routing -----------------------------------------------------------------------------------------

    def node(self, key: str | None) -> tuple[str, int]:
        if key is None or not self._slots:
            return self.seed
        return self._slots.get(_slot(key), self.seed)

    def learn(self, error: str) -> None:
        """Remember the node a MOVED answer (from a pipeline, which the caller handles) names for its slot."""
        self._redirect(error)

    def _redirect(self, error: str) -> tuple[str, tuple[str, int]] | None:
        """('MOVED' or 'ASK', the node) from a redirection answer, the slot remembered for MOVED; else None."""
        word, _, rest = error.partition(" ")
        if word not in ("MOVED", "ASK"):
            return None
        slot, _, address = rest.partition(" ")
        host, _, port = address.rpartition(":")
        if not port.isdigit() or not slot.isdigit():
            return None
        node = (host or self.seed[0], int(port))  # an empty host: the node that answered, as the spec has it
        if word == "MOVED":
            with self._lock:
                self._slots[int(slot)] = node
        return word, node

    # -- commands ----------------------------------------------------------------------------------------

    def command(self, key: str | None, *args: Any, deadline: Deadline | None = None,
                node: tuple[str, int] | None = None) -> Any:
        """One command (to `node`, else routed by `key`'s slot), retried by the retry rule within `deadline`."""
        return self._attempts(lambda conn: _one(conn, args), key, deadline, str(args[0]), node)

    def discover(self, deadline: Deadline | None = None) -> list[tuple[str, int]]:
        """A cluster's primaries, from CLUSTER SLOTS (each slot's node remembered): what MOVED would name."""
        ranges = self.command(None, "CLUSTER", "SLOTS", deadline=deadline)
        primaries: dict[tuple[str, int], None] = {}
        slots: dict[int, tuple[str, int]] = {}
        try:
            for entry in ranges:
                host = entry[2][0].decode() if isinstance(entry[2][0], bytes) else str(entry[2][0])
                node = (host if host not in ("", "?") else self.seed[0], int(entry[2][1]))
                primaries[node] = None
                slots.update((slot, node) for slot in range(int(entry[0]), int(entry[1]) + 1))
        except (TypeError, ValueError, IndexError, AttributeError):
            raise ValkeyError("CLUSTER SLOTS answered in a shape that is not CLUSTER SLOTS'") from None
        with self._lock:
            self._slots.update(slots)
        return list(primaries)

    def pipeline(self, commands: list[tuple[Any, ...]], deadline: Deadline | None = None,
                 node: tuple[str, int] | None = None) -> list[Any]:
        """Several commands sent together to `node` (default: the seed), their answers in order: each an answer or
        a `ValkeyError` for a command the server refused (MOVED included: the caller decides)."""
        return self._attempts(lambda conn: _many(conn, commands), None, deadline, "pipeline", node)

    def _attempts(self, send: Any, key: str | None, deadline: Deadline | None, name: str,
                  node: tuple[str, int] | None = None) -> Any:
        node = node or self.node(key)
        asking = False
        attempt = redirects = 0
        backoff = _FIRST_BACKOFF_S
        maybe_ran = False  # an earlier attempt was sent and got no answer
        while True:
            attempt += 1
            seconds = self._attempt_time(deadline)
            if seconds is None:
                raise ValkeyError(f"{name} was not sent to {_where(node)}: the deadline passed", uncertain=maybe_ran)
            conn = None
            sent = False
            try:
                conn = self._take(node, seconds)
                if asking:
                    conn.send(("ASKING",))
                    conn.read()
                sent = True
                answer = send(conn)
            except ServerError as error:
                if conn is not None:
                    self._give(node, conn)  # the connection is fine: the server answered
                # Refused while connecting: the credentials (AUTH) or the database (SELECT).
                what = name if conn is not None else f"connecting for {name} ({error.step})"
                text = str(error)
                redirect = self._redirect(text)
                if redirect is not None and redirects < _REDIRECTS:
                    redirects += 1
                    asking, node = redirect[0] == "ASK", redirect[1]
                    attempt -= 1  # a redirection is not a failure
                    continue
                code = error.code
                # A refused password may be a rotated secret or an old token: new credentials get another attempt.
                again = code == "WRONGPASS" and not sent and self.auth is not None and self.auth.refused()
                if (code in _BUSY or again) and self._backoff(attempt, backoff, deadline):
                    backoff = min(backoff * 2, _LAST_BACKOFF_S)
                    continue
                # Refused: this attempt did not run (the layer's scripts raise nothing after a write). The server's
                # words name no record content.
                raise ValkeyError(f"{what} on {_where(node)} was refused: {_bounded(text)}", code=code,
                                  uncertain=maybe_ran, step=None if conn is not None else error.step) from None
            except OSError as error:  # refused, reset, timed out, TLS, closed, not RESP
                if conn is not None:
                    conn.close()
                maybe_ran = maybe_ran or sent
                if self._backoff(attempt, backoff, deadline):
                    backoff = min(backoff * 2, _LAST_BACKOFF_S)
                    continue
                how = "sent, no answer: it may have run" if maybe_ran else "not sent"
                raise ValkeyError(f"{name} on {_where(node)} failed ({how}) after {attempt} attempt(s): "
                                  f"{type(error).__name__}: {_bounded(str(error))}", uncertain=maybe_ran) from None
            except BaseException:
                if conn is not None:
                    conn.close()
                raise
            else:
                self._give(node, conn)
                return answer

    def _attempt_time(self, deadline: Deadline | None) -> float | None:
        if deadline is None:
            return max(self.connect_timeout, self.read_timeout)
        return deadline.attempt_time()

    def _backoff(self, attempt: int, backoff: float, deadline: Deadline | None) -> bool:
        """Sleep before another attempt, when one is left and fits; whether there is one."""
        if attempt >= self.max_attempts:
            return False
        pause = backoff * (0.5 + random.random() / 2)
        if deadline is not None and not deadline.allows(pause):
            return False
        time.sleep(pause)
        return True


def _setup(conn: Any, step: str, command: tuple[Any, ...]) -> None:
    """A new connection's AUTH or SELECT; a refusal names it (`ServerError.step`)."""
    conn.send(command)
    try:
        conn.read()
    except ServerError as error:
        error.step = step
        raise


def _one(conn: Any, args: tuple[Any, ...]) -> Any:
    conn.send(args)
    return conn.read()


def _many(conn: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    conn.send(*commands)
    answers: list[Any] = []
    for _ in commands:
        try:
            answers.append(conn.read())
        except ServerError as error:
            answers.append(ValkeyError(_bounded(str(error)), code=error.code))
    return answers


def _slot(key: str) -> int:
    """The cluster's hash slot of `key`: CRC16 (XMODEM) of its hash tag, the text inside its first {...} when that
    is not empty, else of the whole key; modulo 16384."""
    data = key.encode()
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1:end]
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        crc &= 0xFFFF
    return crc % 16384


def _where(node: tuple[str, int]) -> str:
    return f"[{node[0]}]:{node[1]}" if ":" in node[0] else f"{node[0]}:{node[1]}"


def _bounded(text: str) -> str:
    printable = "".join(c if c.isprintable() else "?" for c in text[:200])
    return printable + ("..." if len(text) > 200 else "")
