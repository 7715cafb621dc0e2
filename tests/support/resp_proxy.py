"""A loopback proxy in front of a Valkey / Redis server that counts commands and injects scripted faults.

It reads each command the client sends (RESP arrays), forwards it, reads the server's answer and passes it back,
unless a scripted fault for that command says otherwise:

    CUT      close the client's connection before forwarding (nothing ran)
    DROP     forward (it runs), then close the client's connection instead of answering
    STALL    forward (it runs), then never answer: the connection stays open and silent
    DELAY    forward, then answer after `delay` seconds
    REPLACE  forward (it runs), then answer `replacement` (bytes) instead of the server's answer

`flights` counts the client's round trips: a run of commands read before the proxy answered any of them (a
pipeline is one flight). Its own parser, not the layer's, so the two are checked against each other.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter

CUT, DROP, STALL, DELAY, REPLACE = "cut", "drop", "stall", "delay", "replace"


class RespReader:
    """Reads whole RESP values off a socket, raw (the proxies forward them byte for byte)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buffer += chunk
        return True

    def line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if not self.fill():
                raise EOFError
        line, _, self.buffer = self.buffer.partition(b"\r\n")
        return line

    def exact(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self.fill():
                raise EOFError
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def value(self) -> bytes:
        """One RESP value, raw."""
        return self.parts()[0]

    def parts(self) -> tuple[bytes, list[bytes]]:
        """One RESP value, raw, and its bulk strings at the top level (a command's name and arguments)."""
        line = self.line()
        raw = line + b"\r\n"
        parts: list[bytes] = []
        kind = line[:1]
        if kind == b"$" and int(line[1:]) >= 0:
            data = self.exact(int(line[1:]) + 2)
            raw += data
            parts.append(data[:-2])
        elif kind == b"*" and int(line[1:]) > 0:
            for _ in range(int(line[1:])):
                item, inner = self.parts()
                raw += item
                parts.extend(inner[:1] if item[:1] == b"$" else [])
        return raw, parts


def _name(raw: bytes) -> str:
    lines = raw.split(b"\r\n")
    return lines[2].decode(errors="replace").upper() if len(lines) > 2 else "?"


class RespProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}"
        self.commands: Counter[str] = Counter()
        self.auths: list[list[bytes]] = []  # each AUTH's arguments, as sent
        self.flights = 0
        self.delay = 0.0
        self.replacement = b""  # what REPLACE answers
        self._script: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def script(self, command: str, fault: str) -> None:
        """The next `command` (EVALSHA, HGETALL...) gets `fault`."""
        with self._lock:
            self._script.append((command.upper(), fault))

    def reset(self) -> None:
        with self._lock:
            self.commands.clear()
            self.flights = 0

    def _fault(self, name: str) -> str | None:
        with self._lock:
            for i, (command, fault) in enumerate(self._script):
                if command == name:
                    del self._script[i]
                    return fault
        return None

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._open.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        except OSError:
            client.close()
            return
        with self._lock:
            self._open.append(upstream)
        reader, answers = RespReader(client), RespReader(upstream)
        answered = True
        try:
            while True:
                if not reader.buffer and answered:
                    if not reader.fill():
                        return
                    with self._lock:
                        self.flights += 1
                    answered = False
                command = reader.value()
                name = _name(command)
                with self._lock:
                    self.commands[name] += 1
                    if name == "AUTH":
                        self.auths.append(command.split(b"\r\n")[4::2])
                fault = self._fault(name)
                if fault == CUT:
                    return
                upstream.sendall(command)
                answer = answers.value()
                if fault == DROP:
                    return
                if fault == STALL:
                    while not self._closed:
                        time.sleep(0.05)
                    return
                if fault == DELAY:
                    time.sleep(self.delay)
                if fault == REPLACE:
                    answer = self.replacement
                client.sendall(answer)
                if not reader.buffer:
                    answered = True
        except (OSError, EOFError, ValueError):
            return
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.close()
