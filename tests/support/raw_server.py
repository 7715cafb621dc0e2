"""A TCP server on loopback that hands each connection to a function of the test's: for answers no HTTP server
library would send (a wrong length, a few bytes at a time, a close before any answer)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


def read_head(conn: socket.socket) -> bytes:
    """The request's bytes up to the end of its headers (what arrived with them too)."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            break
        data += part
    return data


class RawServer:
    """Accepts on 127.0.0.1 (a free port) and runs `serve(conn)` on a thread per connection; `accepted` counts the
    connections. `close()` stops accepting and closes every connection still open."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self.serve = serve
        self.accepted = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            self.open.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the client went away, or close() closed it
            self.serve(conn)

    def close(self) -> None:
        self.listener.close()
        self._thread.join(5)
        for conn in self.open:
            conn.close()
