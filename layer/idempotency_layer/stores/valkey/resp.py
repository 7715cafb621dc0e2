"""One connection speaking RESP2, the protocol Valkey, Redis OSS, ElastiCache and MemoryDB answer.

Our own, not valkey-py's: measured on this project's build machine (Python 3.11), `import valkey` takes
64-81 ms (asyncio, importlib.metadata), more than the layer's whole init (about 40 ms), and its modules with the
bytecode the layer ships for five Pythons add about 2.9 MB to a zip whose budget is 3 MiB (2.1 MiB used). A
store uses six commands; this module is what they need (docs/valkey.md).

    request:  *<n>\\r\\n  then each argument as  $<length>\\r\\n<bytes>\\r\\n
    answer:   +text  -error  :integer  $<length> bytes (or $-1: none)  *<n> answers (or *-1: none)

A connection is used by one thread at a time (the client's pool hands it out). Every read and write is bounded
by the socket's timeout, which the client sets before each command from the deadline.
"""

from __future__ import annotations

import select
import socket

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

MAX_BULK = 64 * 1024 * 1024  # a record is at most ~400 KB: a longer answer is a broken server, not a record
MAX_ITEMS = 1_000_000
# The deepest answer the store reads is CLUSTER SLOTS' (arrays three deep). A deeper one is a broken or hostile
# server: refused as not RESP (an uncertain failure), never read by recursing until Python's stack runs out.
MAX_DEPTH = 8


class ServerError(Exception):
    """The server answered with an error: `code` its first word (WRONGTYPE, NOSCRIPT, MOVED...)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        word = text.split(" ", 1)[0]
        self.code = word if word.isupper() and word.isalpha() else None
        self.step: str | None = None  # a refusal while connecting: the command refused (AUTH, SELECT)


class ProtocolError(OSError):
    """The answer is not RESP: the connection cannot be used again."""


def pack(args: tuple[Any, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n" % len(data))
        parts.append(data)
        parts.append(b"\r\n")
    return b"".join(parts)


class Connection:
    def __init__(self, host: str, port: int, timeout: float, tls_context: Any = None) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls_context is not None:
                sock = tls_context.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.file = sock.makefile("rb")

    def bound(self, seconds: float) -> None:
        self.sock.settimeout(seconds)

    def stale(self) -> bool:
        """Whether the connection cannot be reused: closed by the server while idle, or holding bytes no command
        asked for."""
        pending = getattr(self.sock, "pending", None)  # TLS: bytes decrypted but not read
        if pending is not None and pending():
            return True
        try:
            poll = select.poll()
            poll.register(self.sock, select.POLLIN)
            return bool(poll.poll(0))
        except (OSError, ValueError):
            return True

    def send(self, *commands: tuple[Any, ...]) -> None:
        self.sock.sendall(b"".join(pack(command) for command in commands))

    def read(self) -> Any:
        """One answer; an error answer raises `ServerError` (the connection stays usable)."""
        try:
            return self._read()
        except ValueError:  # a length or number that is not one
            raise ProtocolError("an answer that is not RESP") from None

    def _read(self, depth: int = 0) -> Any:
        line = self.file.readline(MAX_ITEMS)
        if not line.endswith(b"\r\n"):
            raise ProtocolError("connection closed" if not line else "an answer line without its end")
        kind, body = line[:1], line[1:-2]
        if kind == b"+":
            return body.decode("utf-8", "replace")
        if kind == b"-":
            raise ServerError(body.decode("utf-8", "replace"))
        if kind == b":":
            return int(body)
        if kind == b"$":
            length = int(body)
            if length < 0:
                return None
            if length > MAX_BULK:
                raise ProtocolError(f"an answer of {length} bytes")
            data = self.file.read(length + 2)
            if len(data) != length + 2 or not data.endswith(b"\r\n"):
                raise ProtocolError("connection closed inside an answer")
            return data[:-2]
        if kind == b"*":
            count = int(body)
            if count < 0:
                return None
            if count > MAX_ITEMS:
                raise ProtocolError(f"an answer of {count} items")
            if depth >= MAX_DEPTH:
                raise ProtocolError(f"an answer of arrays nested deeper than {MAX_DEPTH}")
            items = []
            for _ in range(count):
                try:
                    items.append(self._read(depth + 1))
                except ServerError as error:  # an error inside an array (a script's): kept as a value
                    items.append(error)
            return items
        raise ProtocolError(f"an answer starting {kind!r}")

    def close(self) -> None:
        try:
            self.file.close()
        finally:
            self.sock.close()
