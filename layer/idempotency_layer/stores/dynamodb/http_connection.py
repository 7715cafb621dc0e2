"""One kept-alive HTTP/1.1 connection as the pool (connection.py) uses it, on CPython's `http.client`.

`Connection` is http.client's connection with our reader under every response, one write per request, and no
silent reconnect. `Reader` is that reader: a BufferedReader over `Timed`, the socket as http.client's reader sees
it, which keeps the timeout rule of connection.py's docstring for every read (at most the read timeout, never past
the attempt's end) and counts the bytes received, so that the keep-alive rule can tell an answer read to its exact
end (`ahead`)."""

from __future__ import annotations

import http.client
import io
import select
import socket
import time

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

_BUFFER = 65536  # the reader's buffer: most answers arrive in one read


# -- reading: the timeout rule, and bytes we can count -----------------------------------------------------------


class Timed(io.RawIOBase):
    """The socket as http.client's reader sees it. Each read waits at most `limit` (the read timeout) and never
    past `end` (the attempt's end); `received` counts every byte, `eof` says the peer's end of stream was read.

    It reads through `sock.makefile`'s raw file, which holds the socket open when http.client closes its
    connection before the body of a closing answer is read (as its own makefile reader does)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        self._file = sock.makefile("rb", buffering=0)
        self.timeout = sock.gettimeout()  # what the socket has: settimeout costs a system call, made on change only
        self.end: float | None = None
        self.limit: float | None = None
        self.received = 0
        self.eof = False

    def readable(self) -> bool:
        return True

    def set_timeout(self, timeout: float) -> None:
        if timeout != self.timeout:
            self.sock.settimeout(timeout)
            self.timeout = timeout

    def readinto(self, buffer: Any) -> int | None:
        end = self.end
        if end is not None:  # without an end, the socket keeps the read timeout _exchange gave it
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("the attempt's time ran out while reading")
            self.set_timeout(left if self.limit is None or self.limit > left else self.limit)
        count = self._file.readinto(buffer)
        if count:
            self.received += count
        elif count == 0:
            self.eof = True
        return count

    def tell(self) -> int:
        # The reader's tell() is this minus what it holds unread: how many bytes it has read ahead.
        return self.received

    def close(self) -> None:
        self._file.close()  # the socket closes once http.client has closed it too
        super().close()


class Reader(io.BufferedReader):
    """The answer's reader for every response on one connection (http.client's `fp`); http.client's close of it
    is ignored, as the connection lives on. `ahead()` says how many bytes it has read past what was taken."""

    raw: Timed

    def makefile(self, mode: str) -> Reader:  # HTTPResponse(sock) calls sock.makefile("rb")
        return self

    def close(self) -> None:
        pass

    def flush(self) -> None:  # HTTPResponse.close flushes its fp, maybe after the connection was dropped
        pass

    def ahead(self) -> int:
        return self.raw.received - self.tell()


# -- one connection --------------------------------------------------------------------------------------------


class Connection(http.client.HTTPConnection):
    """http.client's connection, with our reader under every response (after connect), one write per request,
    and no silent reconnect: a connection the server closed must be seen as closed."""

    auto_open = 0
    reader: Reader | None = None
    tls: Any = None  # the SSLSocket over https, for what OpenSSL holds decrypted and unread
    _body: bytes | None = None

    poller: Any = None  # select.poll on the socket, once attached
    tunnel_end: float | None = None  # when the attempt reading a proxy's CONNECT answer ends
    tunnel_reader: Reader | None = None

    # http.client calls response_class(sock, method=...) for every answer: here it reads through our reader, which
    # HTTPResponse takes in place of a socket (it only calls its makefile), so the checker sees a mismatch it is not.
    def response_class(  # type: ignore[override]
            self, sock: Any, debuglevel: int = 0, method: str | None = None,
            url: str | None = None) -> http.client.HTTPResponse:
        if self.reader is None:
            # A proxy's CONNECT answer, before attach(): read through a timed reader too, so that one trickled a
            # byte at a time cannot hold the attempt past its end (each read waits at most the socket's timeout).
            timed = Timed(sock)
            timed.end, timed.limit = self.tunnel_end, sock.gettimeout()
            self.tunnel_reader = Reader(timed, _BUFFER)
            return http.client.HTTPResponse(self.tunnel_reader, debuglevel, method)  # type: ignore[arg-type]
        return http.client.HTTPResponse(self.reader, debuglevel, method)  # type: ignore[arg-type]

    def tunnel_done(self) -> bool:
        """Let go of the CONNECT answer's reader; False if the proxy sent bytes after that answer (before our TLS
        handshake began), which no TLS server does."""
        reader, self.tunnel_reader = self.tunnel_reader, None
        if reader is None:
            return True
        clean = reader.ahead() == 0
        reader.raw.close()  # its file on the socket, before the socket is wrapped for TLS
        return clean

    def attach(self) -> None:
        """Put our reader on the connected (and, over https, wrapped) socket, and the poll object `_alive` asks."""
        self.reader = Reader(Timed(self.sock), _BUFFER)
        self.poller = select.poll()
        self.poller.register(self.sock, select.POLLIN)

    def send(self, data: Any) -> None:
        body = self._body
        if body is not None:  # endheaders() sends the head: the body goes in the same write
            self._body = None
            data = data + body
        super().send(data)

    def request_body(self, body: bytes) -> None:
        self._body = body

    def ahead(self) -> int:
        """Bytes received and not read: buffered by our reader, or decrypted and held by OpenSSL."""
        reader = self.reader
        return (reader.ahead() if reader is not None else 0) + (self.tls.pending() if self.tls is not None else 0)

    def drop(self) -> None:
        self.close()  # http.client's socket (held open while our reader has it)
        if self.reader is not None:
            self.reader.raw.close()
