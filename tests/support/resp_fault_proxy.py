"""A loopback proxy in front of a Valkey / Redis server that faults a share of the commands, drawn from a seeded RNG
(the Valkey soak's, tools/valkey_soak.py; `resp_proxy.RespProxy` is the scripted one of the store tests).

Per command (each command of a pipeline on its own), at configured rates:

    reset    the client's connection reset before the command is forwarded: nothing ran
    drop     forwarded (it runs), then the connection reset instead of the answer: the command ran, unheard
    cut      forwarded (it runs), then the first part of the answer (at least one byte, never all of it) and a
             reset: an answer cut off after the command was sent
    latency  a spike, before forwarding or after the answer (either, at random)
    loading  answered `-LOADING ...` without forwarding, as a server still loading its data after a restart says

Everything else is forwarded as it is. It counts what it did per kind and per command (a script by its name:
claim, complete, release, from the layer's own script texts, whether sent as EVALSHA or EVAL), and apart from those,
`upstream_error`: the server itself closed or refused the connection (a restart), so a soak can tell its faults from
the server's. Its own parser, not the layer's, so the two are checked against each other.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Mapping

from tests.support.resp_proxy import RespReader

RESET, DROP, CUT, LATENCY, LOADING = "reset", "drop", "cut", "latency", "loading"
KINDS = (RESET, DROP, CUT, LATENCY, LOADING)
FORWARDED = "forwarded"
UPSTREAM_ERROR = "upstream_error"  # the server closed the connection mid-command, or refused a new one
CONNECTIONS = "connections"
LOADING_ANSWER = b"-LOADING Valkey is loading the dataset in memory\r\n"
_UPSTREAM_TIMEOUT = 30.0


def even_mix(rate: float, kinds: tuple[str, ...] = KINDS) -> dict[str, float]:
    """`rate` of all commands faulted, shared evenly among `kinds`."""
    if not 0 <= rate <= 1:
        raise ValueError(f"a fault rate is a fraction between 0 and 1, not {rate}")
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise ValueError(f"fault kinds are some of {', '.join(KINDS)}, not {sorted(unknown) or 'none'}")
    return {kind: rate / len(kinds) for kind in kinds}


def script_names() -> dict[str, str]:
    """SHA-1 and source of the layer's scripts -> their names (the layer's own texts, when it is importable)."""
    import importlib

    store = None
    for module in ("idempotency_layer.stores.valkey.store", "idempotency_layer.valkey_store.store"):
        with contextlib.suppress(ImportError):
            store = importlib.import_module(module)
            break
    names: dict[str, str] = {}
    if store is None:
        return names
    for name in ("CLAIM", "COMPLETE", "RELEASE", "PURGE"):
        source = getattr(store, name, None)
        if isinstance(source, str):
            names[hashlib.sha1(source.encode()).hexdigest()] = name.lower()
            names[source] = name.lower()
    return names


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST, as a network fault does."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class RespFaultProxy:
    """Listens on a free loopback port; `endpoint` (a redis:// URL) is what the layer is pointed at. `rates` maps
    each kind (KINDS) to the fraction of commands that get it; `spike` is a latency spike's range, seconds."""

    def __init__(self, upstream_port: int, rates: Mapping[str, float] | None = None, *, seed: int = 0,
                 spike: tuple[float, float] = (0.2, 1.0)) -> None:
        unknown = set(rates or {}) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        if rates and (any(r < 0 for r in rates.values()) or sum(rates.values()) > 1 + 1e-9):
            raise ValueError(f"fault rates must be fractions summing to at most 1: {dict(rates)}")
        self.upstream_port = upstream_port
        self.spike = spike
        self._rates = [(kind, (rates or {})[kind]) for kind in KINDS if (rates or {}).get(kind)]
        self._rng = random.Random(seed)
        self._names = script_names()
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.by_operation: Counter[tuple[str, str]] = Counter()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"redis://127.0.0.1:{self.port}"
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, name=f"resp-fault-proxy-{self.port}", daemon=True)
        self._acceptor.start()

    # -- what it did --------------------------------------------------------------------------------------

    def snapshot(self) -> Counter[str]:
        """Commands seen, forwarded untouched, faulted per kind, broken by the server itself; connections. A Counter:
        a kind it does not make reads 0."""
        with self._lock:
            return Counter({"requests": self.counts["requests"], FORWARDED: self.counts[FORWARDED],
                            **{kind: self.counts[kind] for kind in KINDS},
                            UPSTREAM_ERROR: self.counts[UPSTREAM_ERROR], CONNECTIONS: self.counts[CONNECTIONS]})

    def operations(self) -> dict[str, dict[str, int]]:
        """Per command (claim, complete, release: the scripts; HGETALL, INFO, ...): how many got each treatment."""
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
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
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

    def __enter__(self) -> RespFaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------------

    def _operation(self, parts: list[bytes]) -> str:
        name = parts[0].decode(errors="replace").upper() if parts else "?"
        if name in ("EVALSHA", "EVAL") and len(parts) > 1:
            script = self._names.get(parts[1].decode(errors="replace"), "script")
            return script + (" (EVAL)" if name == "EVAL" else "")
        return name

    def _draw(self, operation: str) -> tuple[str, float]:
        with self._lock:
            roll = self._rng.random()
            kind = FORWARDED
            for name, rate in self._rates:
                if roll < rate:
                    kind = name
                    break
                roll -= rate
            delay = self._rng.uniform(*self.spike) * self._rng.choice((-1, 1)) if kind == LATENCY else 0.0
            self.counts["requests"] += 1
            self.counts[kind] += 1
            self.by_operation[(kind, operation)] += 1
            return kind, delay

    def _cut_at(self, size: int) -> int:
        with self._lock:
            return self._rng.randint(1, max(1, size - 1))

    def _upstream_error(self) -> None:
        with self._lock:
            self.counts[UPSTREAM_ERROR] += 1

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._sockets.add(sock)
            return True

    def _forget(self, *socks: socket.socket | None) -> None:
        with self._lock:
            for sock in socks:
                if sock is not None:
                    self._sockets.discard(sock)

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
            threading.Thread(target=self._serve, args=(client,), name=f"resp-fault-proxy-{self.port}-conn",
                             daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        reader = RespReader(client)
        answers: RespReader | None = None
        try:
            while True:
                try:
                    command, parts = reader.parts()
                except EOFError:
                    return
                kind, delay = self._draw(self._operation(parts))
                if kind == RESET:
                    _reset(client)
                    return
                if kind == LOADING:
                    client.sendall(LOADING_ANSWER)
                    continue
                if delay < 0:
                    time.sleep(-delay)
                if upstream is None:
                    try:
                        upstream = socket.create_connection(("127.0.0.1", self.upstream_port),
                                                            timeout=_UPSTREAM_TIMEOUT)
                    except OSError:
                        self._upstream_error()  # the server is down (a restart): the client sees a reset
                        _reset(client)
                        return
                    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    if not self._track(upstream):
                        upstream.close()
                        return
                    answers = RespReader(upstream)
                assert answers is not None
                try:
                    upstream.sendall(command)
                    answer = answers.value()
                except (OSError, EOFError, ValueError):
                    self._upstream_error()  # the server went away with the command (a restart)
                    _reset(client)
                    return
                if kind == DROP:
                    _reset(client)
                    return
                if kind == CUT:
                    client.sendall(answer[:self._cut_at(len(answer))])
                    _reset(client)
                    return
                if delay > 0:
                    time.sleep(delay)
                client.sendall(answer)
        except (OSError, ValueError):
            _reset(client)
        finally:
            self._forget(client, upstream)
            for sock in (client, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
