"""A loopback HTTP/1.1 proxy in front of DynamoDB Local that injects the faults DynamoDB and networks produce.

Per request, at configured rates drawn from a seeded RNG, it answers a throttle (`ThrottlingException` or
`ProvisionedThroughputExceededException`, HTTP 400 with DynamoDB's JSON error body) or an
`InternalServerError` (500) without forwarding; resets the connection before forwarding; forwards and then
resets instead of replying (the write lands, the client never hears); or forwards after, or replies after, a
latency spike. Everything else is forwarded as it is. It reads whole HTTP/1.1 messages (Content-Length or
chunked bodies) over kept-alive connections, as the layer's transport keeps them alive, and counts what it
did per kind and per operation, so a soak reports the faults the wire really carried.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import struct
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping

THROTTLE = "throttle"
PROVISIONED = "provisioned"
INTERNAL = "internal"
RESET = "reset"
DROP_REPLY = "drop_reply"
LATENCY = "latency"
KINDS = (THROTTLE, PROVISIONED, INTERNAL, RESET, DROP_REPLY, LATENCY)
# Stalls, only ever scripted (`FaultProxy.script`), never drawn: the request is read and never answered (a
# half-open connection; nothing is forwarded), or forwarded and answered with the first byte of DynamoDB's
# answer only. Either way the connection then stays open, silent, until the proxy closes.
STALL = "stall"
STALL_AFTER_BYTE = "stall_after_byte"
# Damaged answers, also only scripted: the request is forwarded (and applied), then the client gets a 200 whose
# body is a proxy's page (NOT_JSON) or nothing (EMPTY), or DynamoDB's own answer with a Content-Length 5 bytes
# short and no x-amz-crc32 (SHORT), and the connection is closed.
NOT_JSON = "not_json"
EMPTY = "empty"
SHORT = "short"
# ... or a 400 ConditionalCheckFailedException whatever DynamoDB answered, its body cut short the same way.
SHORT_REFUSAL = "short_refusal"
DAMAGED = (NOT_JSON, EMPTY, SHORT, SHORT_REFUSAL)
SCRIPTED = (STALL, STALL_AFTER_BYTE, *DAMAGED, *KINDS)
FORWARDED = "forwarded"  # passed through untouched
CONNECTIONS = "connections"  # client connections accepted
UPSTREAM_ERROR = "upstream_error"  # DynamoDB Local failed or closed the connection: the client was reset

# What DynamoDB answers for each injected error: status, error type, message.
_ERRORS = {
    THROTTLE: (400, "ThrottlingException", "Rate of requests exceeds the allowed throughput."),
    PROVISIONED: (400, "ProvisionedThroughputExceededException",
                  "The level of configured provisioned throughput for the table was exceeded. "
                  "Consider increasing your provisioning level with the UpdateTable API."),
    INTERNAL: (500, "InternalServerError", "Internal server error"),
}
_REASONS = {400: "Bad Request", 500: "Internal Server Error"}
_TARGET_PREFIX = "dynamodb_20120810."
_MAX_HEAD = 64 * 1024
_UPSTREAM_TIMEOUT = 30.0


def even_mix(rate: float, kinds: tuple[str, ...] = KINDS) -> dict[str, float]:
    """`rate` of all requests faulted, shared evenly among `kinds`."""
    if not 0 <= rate <= 1:
        raise ValueError(f"a fault rate is a fraction between 0 and 1, not {rate}")
    return {kind: rate / len(kinds) for kind in kinds}


class _Closed(Exception):
    """The peer closed the connection at a message boundary."""


class _Reader:
    """Buffered reads of HTTP/1.1 messages from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise _Closed
        self.buffer += data

    def until(self, marker: bytes, limit: int = _MAX_HEAD) -> bytes:
        while (end := self.buffer.find(marker)) < 0:
            if len(self.buffer) > limit:
                raise ValueError("HTTP head too long")
            self._fill()
        end += len(marker)
        data, self.buffer = self.buffer[:end], self.buffer[end:]
        return data

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._fill()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def rest(self) -> bytes:
        """Everything until the peer closes (a response delimited by the end of the connection)."""
        with contextlib.suppress(_Closed):
            while True:
                self._fill()
        data, self.buffer = self.buffer, b""
        return data

    def message(self, response: bool = False) -> tuple[bytes, dict[str, str], bytes, bool]:
        """One message: (head, lower-cased headers, body as sent, whether the connection stays open).

        `_Closed` when the peer closed before a message began."""
        head = self.until(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        start = lines[0].decode("latin-1")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        version = start.split(" ", 1)[0] if response else start.rsplit(" ", 1)[-1]
        connection = headers.get("connection", "").lower()
        keep = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        status = int(start.split(" ", 2)[1]) if response else 0
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._chunked()
        elif "content-length" in headers:
            body = self.exactly(int(headers["content-length"]))
        elif response and not (100 <= status < 200 or status in (204, 304)):
            body, keep = self.rest(), False
        else:
            body = b""
        return head, headers, body, keep

    def _chunked(self) -> bytes:
        raw = b""
        while True:
            line = self.until(b"\r\n")
            raw += line
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (trailer := self.until(b"\r\n")) != b"\r\n":
                    raw += trailer
                return raw + b"\r\n"
            raw += self.exactly(size + 2)


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST rather than a FIN: the peer sees 'connection reset', as after a network fault."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def damaged(kind: str, head: bytes, body: bytes) -> bytes:
    """The DAMAGED treatment `kind` of DynamoDB's answer `head` + `body`."""
    if kind in (NOT_JSON, EMPTY):
        page = b"<html>hello</html>" if kind == NOT_JSON else b""
        return (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
                b"Content-Length: " + str(len(page)).encode() + b"\r\n\r\n" + page)
    if kind == SHORT_REFUSAL:
        body = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
                           "message": "The conditional request failed"}).encode()
        head = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.0\r\n\r\n"
    lines = [line for line in head.split(b"\r\n")
             if not line.lower().startswith((b"content-length:", b"x-amz-crc32:", b"connection:"))]
    lines.insert(1, b"Content-Length: " + str(max(0, len(body) - 5)).encode())
    lines.insert(1, b"Connection: close")
    return b"\r\n".join(lines[:-2]) + b"\r\n\r\n" + body


def error_response(kind: str) -> bytes:
    """DynamoDB's answer for an injected error, headers and CRC32 as DynamoDB sends them."""
    status, code, message = _ERRORS[kind]
    body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": message},
                      separators=(",", ":")).encode()
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
            f"x-amzn-RequestId: {uuid.uuid4().hex.upper()}\r\n"
            f"x-amz-crc32: {zlib.crc32(body)}\r\n"
            "Content-Type: application/x-amz-json-1.0\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: keep-alive\r\n\r\n")
    return head.encode() + body


class FaultProxy:
    """Listens on a free loopback port; `endpoint` is what the layer is pointed at.

    `rates` maps each kind of fault (KINDS) to the fraction of requests that get it (their sum at most 1);
    `spike` is the range of a latency spike, in seconds. `set_rates` changes them while running. `operations`,
    when given, are the only ones faulted (e.g. {"UpdateItem"}: the completion write); the rest pass untouched.
    """

    def __init__(self, upstream_host: str, upstream_port: int, rates: Mapping[str, float] | None = None, *,
                 seed: int = 0, spike: tuple[float, float] = (0.2, 1.0),
                 operations: Iterable[str] | None = None) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.spike = spike
        self.only = None if operations is None else frozenset(operations)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._rates: list[tuple[str, float]] = []
        self.set_rates(rates or {})
        self.counts: Counter[str] = Counter()
        self.by_operation: Counter[tuple[str, str]] = Counter()
        self._scripts: dict[str, list[str]] = {}
        self.arrivals: list[tuple[float, str, str]] = []  # (time.monotonic(), operation, treatment) per request
        self._stopped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, name=f"fault-proxy-{self.port}", daemon=True)
        self._acceptor.start()

    def set_rates(self, rates: Mapping[str, float]) -> None:
        unknown = set(rates) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        if any(rate < 0 for rate in rates.values()) or sum(rates.values()) > 1 + 1e-9:
            raise ValueError(f"fault rates must be fractions summing to at most 1: {dict(rates)}")
        with self._lock:
            self._rates = [(kind, rates[kind]) for kind in KINDS if rates.get(kind)]

    def script(self, operation: str, *treatments: str) -> None:
        """The next requests of `operation` get `treatments`, one each, in order, before any drawn fault."""
        unknown = set(treatments) - set(SCRIPTED)
        if unknown:
            raise ValueError(f"unknown treatments {sorted(unknown)}; known: {', '.join(SCRIPTED)}")
        with self._lock:
            self._scripts.setdefault(operation, []).extend(treatments)

    def snapshot(self) -> dict[str, int]:
        """Requests seen, forwarded untouched, faulted per kind, broken by DynamoDB Local itself; connections."""
        with self._lock:
            return {"requests": self.counts["requests"], FORWARDED: self.counts[FORWARDED],
                    **{kind: self.counts[kind] for kind in KINDS}, UPSTREAM_ERROR: self.counts[UPSTREAM_ERROR],
                    CONNECTIONS: self.counts[CONNECTIONS]}

    def operations(self) -> dict[str, dict[str, int]]:
        """Per operation (PutItem, UpdateItem, ...): how many requests got each treatment."""
        with self._lock:
            table: dict[str, dict[str, int]] = {}
            for (kind, operation), count in self.by_operation.items():
                table.setdefault(operation, {})[kind] = count
            return table

    def faults(self) -> int:
        with self._lock:
            return sum(self.counts[kind] for kind in KINDS)

    def close(self) -> None:
        self._closed = True
        self._stopped.set()  # wakes the stalled connections
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self._acceptor.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------------

    def _draw(self, operation: str) -> tuple[str, float]:
        """This request's treatment, and its spike in seconds (negative: before forwarding)."""
        with self._lock:
            scripted = self._scripts.get(operation)
            if scripted:
                kind = scripted.pop(0)
            else:
                roll = self._rng.random()
                kind = FORWARDED
                for name, rate in self._rates if self.only is None or operation in self.only else ():
                    if roll < rate:
                        kind = name
                        break
                    roll -= rate
            delay = self._rng.uniform(*self.spike) * self._rng.choice((-1, 1)) if kind == LATENCY else 0.0
            self.arrivals.append((time.monotonic(), operation, kind))
            self.counts["requests"] += 1
            self.counts[kind] += 1
            self.by_operation[(kind, operation)] += 1
            return kind, delay

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._sockets.add(sock)
            return True

    def _forget(self, *socks: socket.socket | None) -> None:
        with self._lock:
            for sock in socks:
                self._sockets.discard(sock)  # type: ignore[arg-type]

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.counts[CONNECTIONS] += 1
            if not self._track(client):
                client.close()
                return
            threading.Thread(target=self._serve, args=(client,), name=f"fault-proxy-{self.port}-conn",
                             daemon=True).start()

    def _connect(self) -> socket.socket:
        upstream = socket.create_connection(self.upstream, timeout=_UPSTREAM_TIMEOUT)
        # Nagle off: a request written as headers then body would wait out delayed ACKs (~40 ms) here.
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self._track(upstream):
            upstream.close()
            raise OSError("proxy closed")
        return upstream

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        reader = _Reader(client)
        upstream_reader: _Reader | None = None
        try:
            while True:
                try:
                    head, headers, body, keep = reader.message()
                except _Closed:
                    return
                if headers.get("expect", "").lower() == "100-continue":
                    # Answered here; the request goes upstream whole (with the header, which it then ignores).
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                target = headers.get("x-amz-target", "")
                operation = target[len(_TARGET_PREFIX):] if target.lower().startswith(_TARGET_PREFIX) else "other"
                kind, delay = self._draw(operation)
                if kind in _ERRORS:
                    client.sendall(error_response(kind))
                    if not keep:
                        return
                    continue
                if kind == RESET:
                    _reset(client)
                    return
                if kind == STALL:
                    self._stopped.wait()
                    return
                if delay < 0:
                    time.sleep(-delay)
                if upstream is None:
                    upstream = self._connect()
                    upstream_reader = _Reader(upstream)
                assert upstream_reader is not None
                try:
                    upstream.sendall(head + body)
                    r_head, _, r_body, r_keep = upstream_reader.message(response=True)
                except (OSError, ValueError, _Closed):
                    with self._lock:  # not one of ours: shown apart, so a soak can tell
                        self.counts[UPSTREAM_ERROR] += 1
                    raise
                if kind == DROP_REPLY:  # the request took effect; the client never hears of it
                    _reset(client)
                    return
                if kind in DAMAGED:  # the request took effect; its answer is not DynamoDB's
                    client.sendall(damaged(kind, r_head, r_body))
                    return
                if kind == STALL_AFTER_BYTE:  # the request took effect; its answer stops after one byte
                    client.sendall((r_head + r_body)[:1])
                    self._stopped.wait()
                    return
                if delay > 0:
                    time.sleep(delay)
                client.sendall(r_head + r_body)
                if not r_keep:
                    self._forget(upstream)
                    upstream.close()
                    upstream = upstream_reader = None
                if not keep:
                    return
        except (OSError, ValueError, _Closed):
            _reset(client)  # a broken exchange: the client must not take a partial answer for a whole one
        finally:
            self._forget(client, upstream)
            for sock in (client, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
