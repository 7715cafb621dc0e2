"""A TCP proxy that counts DynamoDB requests on the wire, by operation, and the bytes clients send.

It sits between a client and DynamoDB Local, so it counts what any client (the layer's transports, boto3,
Powertools) really sends, retries included, without trusting any client's own report.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections import Counter

_TARGET = re.compile(rb"X-Amz-Target:[ \t]*DynamoDB_20120810\.(\w+)\r\n", re.IGNORECASE)
# S3's object requests (in front of an S3-compatible server): counted as PutObject, GetObject, DeleteObject.
_S3 = re.compile(rb"(?:^|\n)(PUT|GET|DELETE) /[^ \r\n]* HTTP/1\.1\r\n")
_S3_NAMES = {"PUT": "PutObject", "GET": "GetObject", "DELETE": "DeleteObject"}
_KEEP = 200  # bytes kept across reads so a header split between two reads is still seen once


class CountingProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.bytes_sent = 0
        self.bytes_received = 0  # what the server answered
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def total(self) -> int:
        with self._lock:
            return sum(self.requests.values())

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.bytes_sent = 0
            self.bytes_received = 0

    def snapshot(self) -> tuple[dict[str, int], int]:
        with self._lock:
            return dict(self.requests), self.bytes_sent

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def drop_connections(self) -> None:
        """Close every open connection, both legs, as a server does with idle ones; new ones are accepted."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            # Nagle off on both legs: a request written as headers then body would otherwise wait out the
            # peer's delayed ACK here (~40 ms), which is the proxy's latency, not the client's.
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, outbound: bool) -> None:
        tail = b""
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if outbound:
                    window = tail + data
                    # Count only matches that end in the new data, so none is counted twice.
                    found = [m.group(1).decode() for m in _TARGET.finditer(window) if m.end() > len(tail)]
                    found += [_S3_NAMES[m.group(1).decode()] for m in _S3.finditer(window) if m.end() > len(tail)]
                    with self._lock:
                        self.requests.update(found)
                        self.bytes_sent += len(data)
                    tail = window[-_KEEP:]
                else:
                    with self._lock:
                        self.bytes_received += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
