"""The HTTP connections (`idempotency_layer.stores.dynamodb.connection.Pool`) against real servers on 127.0.0.1: plain
sockets answering canned bytes, TLS with a CA made here, and an HTTP proxy. Sections are named for the behaviour
they pin: how answers are read, what is kept alive, early answers, the one free re-send, timeouts, errors, TLS,
proxies, descriptors past 1024, fork."""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import subprocess
import threading
import time
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer.stores.dynamodb.connection import Budget, Pool, SendError

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


_POOLS: list[Pool] = []


def make_pool(endpoint: str, **options) -> Pool:
    pool = Pool(endpoint, **options)
    _POOLS.append(pool)
    return pool


@pytest.fixture(autouse=True)
def _close_pools():
    yield
    while _POOLS:
        _POOLS.pop().close()


def read_request(reader) -> tuple[bytes, bytes] | None:
    """One request from `reader`: (head, body), or None when the client closed first."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = reader.read(1)
        if not byte:
            return None
        head += byte
    lengths = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    body = reader.read(int(lengths[0].split(b":")[1])) if lengths else b""
    return head, body


def accepted(listener, tls):
    """Each connection `listener` accepts until it is shut down, TLS-wrapped with `tls` when given (one whose
    handshake fails is dropped)."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        if tls is not None:
            try:
                client = tls.wrap_socket(client, server_side=True)
            except OSError:
                client.close()
                continue
        yield client


class Server:
    """Answers the n-th request (over all connections) with `answers[n]`: (bytes, close after it); past the
    list, OK kept alive. Records each request's head and body and counts connections."""

    def __init__(self, *answers, tls=None):
        self.answers = list(answers)
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._tls = tls
        self._clients: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.netloc = f"127.0.0.1:{self.port}"
        self.endpoint = f"{'https' if tls else 'http'}://{self.netloc}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        for client in accepted(self._listener, self._tls):
            with self._lock:
                self.connections += 1
                self._clients.append(client)
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _connection(self, client):
        reader = client.makefile("rb")
        try:
            while True:
                request = read_request(reader)
                if request is None:
                    return
                with self._lock:
                    n = len(self.requests)
                    self.requests.append(request)
                data, close = self.answers[n] if n < len(self.answers) else (OK, False)
                client.sendall(data)
                if close:
                    with contextlib.suppress(OSError):
                        client.shutdown(socket.SHUT_RDWR)  # the reader holds the socket open otherwise
                    return
        except OSError:
            return
        finally:
            reader.close()
            client.close()

    def close(self):
        stop_listening(self._listener)
        with self._lock:
            for client in self._clients:
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)


def _started(make):
    """A fixture's factory: `make(...)` started as the test asks, each closed when the test ends."""
    started = []

    def start(*args, **kwargs):
        started.append(make(*args, **kwargs))
        return started[-1]

    yield start
    for each in started:
        each.close()


@pytest.fixture
def serve():
    yield from _started(Server)


def pool_for(server, **kwargs) -> Pool:
    options = {"connect_timeout": 2, "read_timeout": 2, **kwargs}
    return make_pool(server.endpoint, **options)


def headers_for(server) -> dict[str, str]:
    return {"Host": server.netloc, "X-Amz-Target": "DynamoDB_20120810.GetItem"}


def raw(status_line: str, headers: dict, body: bytes, close: bool = False) -> tuple[bytes, bool]:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"{status_line}\r\n{head}\r\n".encode() + body, close


def stop_listening(listener: socket.socket) -> None:
    # shutdown first: a close alone leaves the socket listening while another thread is blocked in accept().
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    listener.close()


def wait_for(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# -- what is written -------------------------------------------------------------------------------------------


def test_the_request_carries_exactly_the_callers_headers_and_a_length(serve):
    server = serve()
    pool = make_pool(server.endpoint + "/some/path", connect_timeout=2, read_timeout=2)
    answer = pool.send({"Host": "dynamodb.example:443", "X-Amz-Target": "T", "Accept-Encoding": "identity"}, b"abc")
    assert answer == (200, {"content-length": "2"}, b"{}")
    head, body = server.requests[0]
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /some/path HTTP/1.1" and body == b"abc"
    assert lines[1:-2] == ["Host: dynamodb.example:443", "X-Amz-Target: T", "Accept-Encoding: identity",
                           "Content-Length: 3"]  # no Host or Accept-Encoding of http.client's own


def test_a_header_http_cannot_carry_is_refused_without_its_value(serve):
    server = serve()
    pool = pool_for(server)
    with pytest.raises(ValueError) as caught:
        pool.send({"Host": server.netloc, "X-Amz-Security-Token": "secret\r\nX-Injected: 1"}, b"")
    assert "X-Amz-Security-Token" in str(caught.value) and "secret" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert pool.send(headers_for(server), b"").status == 200 and len(server.requests) == 1


# -- how answers are read: every framing HTTP/1.1 allows, by http.client ------------------------------------------


def chunked(body: bytes, sizes: list[int], extension: bool, trailers: bool, upper: bool) -> bytes:
    out, rest = b"", body
    for size in sizes:
        piece, rest = rest[:size], rest[size:]
        if piece:
            out += (b"%X" if upper else b"%x") % len(piece) + (b";name=value" if extension else b"") + b"\r\n"
            out += piece + b"\r\n"
    if rest:
        out += b"%x\r\n" % len(rest) + rest + b"\r\n"
    return out + b"0\r\n" + (b"X-Trailer: t\r\nX-Other: o\r\n" if trailers else b"") + b"\r\n"


@st.composite
def framed(draw):
    """(answer bytes, close after it, body, whether the connection may be kept)."""
    body = draw(st.binary(max_size=300))
    framing = draw(st.sampled_from(["length", "chunked", "to-close", "http/1.0", "http/1.0 keep-alive"]))
    interim = draw(st.sampled_from([b"", b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 102 Processing\r\n\r\n",
                                    b"HTTP/1.1 100 Continue\r\nX-A: b\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n"]))
    says_close = draw(st.booleans())
    extra = draw(st.sampled_from([b"", b"H", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]))
    version = "HTTP/1.1"
    headers = {"Content-Type": "application/x-amz-json-1.0"}
    if says_close:
        headers["Connection"] = "close"
    if framing == "length":
        data = body
        headers["Content-Length"] = len(body)
    elif framing == "chunked":
        sizes = draw(st.lists(st.integers(1, 64), max_size=6))
        data = chunked(body, sizes, draw(st.booleans()), draw(st.booleans()), draw(st.booleans()))
        headers["Transfer-Encoding"] = "chunked"
    elif framing == "to-close":
        data, extra = body, b""  # anything after is body
    else:
        version = "HTTP/1.0"
        data = body
        headers["Content-Length"] = len(body)
        if framing == "http/1.0 keep-alive" and not says_close:
            headers["Connection"] = "keep-alive"
    answer, _ = raw(f"{version} 200 OK", headers, data)
    keepable = framing in ("length", "chunked", "http/1.0 keep-alive") and not says_close and not extra
    return interim + answer + extra, not keepable, body, keepable


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(framed())
def test_every_framing_is_read_to_the_same_body_and_only_an_exact_end_is_kept(serve, case):
    data, close, body, keepable = case
    server = serve((data, close))
    pool = pool_for(server)
    try:
        answer = pool.send(headers_for(server), b"{}")
        assert answer.status == 200 and answer.body == body
        assert pool.send(headers_for(server), b"{}") == (200, {"content-length": "2"}, b"{}")  # not the extra
        assert (server.connections, pool.opened) == ((1, 1) if keepable else (2, 2))
    finally:
        pool.close()


def test_headers_are_lower_cased_repeated_ones_joined_and_folded_ones_unfolded(serve):
    server = serve((b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Amz-Crc32:\r\n 12345\r\nSet: a\r\nset: b \r\n"
                    b"Content-Length: 2\r\n\r\n{}", False))
    answer = pool_for(server).send(headers_for(server), b"")
    assert answer.headers == {"content-length": "2, 2", "x-amz-crc32": "12345", "set": "a, b"}


BROKEN = [
    raw("garbage", {}, b"", close=True),
    raw("HTTP/1.1 200 OK", {"Content-Length": 50}, b"{}", close=True),  # cut short
    raw("HTTP/1.1 200 OK", {"Transfer-Encoding": "chunked"}, b"zz\r\n", close=True),
    raw("HTTP/1.1 200 OK", {"Transfer-Encoding": "chunked"}, b"10\r\nsecret", close=True),
    (b"", True),
    (b"HTTP/1.1 200 OK", True),  # the stream ends inside the head: not a 200 with no body
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", True),
    # Statuses http.client refuses: never taken for a success.
    raw("HTTP/1.1 0 OK", {"Content-Length": 2}, b"{}", close=True),
    raw("HTTP/1.1 99 OK", {"Content-Length": 2}, b"{}", close=True),
    raw("HTTP/1.1 020 OK", {"Content-Length": 2}, b"{}", close=True),
    raw("HTTP/1.1 2000 OK", {"Content-Length": 2}, b"{}", close=True),
    raw("HTTP/2 200 OK", {"Content-Length": 2}, b"{}", close=True),
    # Content-Lengths that do not say where the body ends.
    raw("HTTP/1.1 200 OK", {"Content-Length": "2, 3"}, b"{}", close=True),
    raw("HTTP/1.1 200 OK", {"Content-Length": "two"}, b"{}", close=True),
    raw("HTTP/1.1 200 OK", {"Content-Length": "-2"}, b"{}", close=True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x", True),
    (b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 70000 + b"\r\n\r\n", True),  # a line past http.client's limit
    # Longer than any answer to the layer's requests: refused, not read into memory (a hostile review's
    # Content-Length: 99999999999999 gave a MemoryError).
    raw("HTTP/1.1 200 OK", {"Content-Length": 99999999999999}, b"{}", close=True),
    raw("HTTP/1.1 200 OK", {"Content-Length": 4 * 1024 * 1024 + 1}, b"{}", close=True),
    raw("HTTP/1.1 200 OK", {"Transfer-Encoding": "chunked"}, b"%x\r\n" % (5 * 1024 * 1024) + b" " * (5 * 1024 * 1024)
        + b"\r\n0\r\n\r\n", close=True),
]


@pytest.mark.parametrize("answer", BROKEN)
def test_a_broken_answer_is_a_closed_connection_naming_no_content(serve, answer):
    server = serve(answer)
    with pytest.raises(SendError) as caught:
        pool_for(server).send(headers_for(server), b"")
    error = caught.value
    assert (error.code, error.sent) == ("ConnectionClosedError", True)
    assert str(error) == ('Connection was closed before we received a valid response from endpoint URL: '
                          f'"{server.endpoint}/".')
    assert error.__cause__ is None and "secret" not in repr(error)


# -- what is kept alive ----------------------------------------------------------------------------------------


def test_connections_are_kept_alive_and_pooled_across_threads(serve):
    server = serve()
    pool = pool_for(server, connect_timeout=5)
    for _ in range(5):
        pool.send(headers_for(server), b"")
    assert server.connections == 1 and pool.opened == 1
    barrier = threading.Barrier(12)
    errors = []

    def work():
        try:
            barrier.wait(5)
            for _ in range(3):
                assert pool.send(headers_for(server), b"").body == b"{}"
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not errors and len(server.requests) == 41
    assert pool.opened <= 12 and len(pool._idle) <= 10  # at most 10 kept idle


def test_bytes_after_an_answer_are_never_taken_as_the_next_ones(serve):
    # The first answer comes with a second one glued behind it in the same write: kept in a read buffer, it
    # would be taken as the reply to the next request, a wrong answer rather than an error.
    smuggled = raw("HTTP/1.1 200 OK", {"Content-Length": 5}, b"wrong")[0]
    server = serve((raw("HTTP/1.1 200 OK", {"Content-Length": 5}, b"first")[0] + smuggled, False),
                   raw("HTTP/1.1 200 OK", {"Content-Length": 6}, b"second"))
    pool = pool_for(server)
    assert pool.send(headers_for(server), b"").body == b"first"
    assert pool._idle == []  # not given back (one write on loopback: read along with the answer)
    assert pool.send(headers_for(server), b"").body == b"second"
    assert pool.opened == 2 and server.connections == 2


def test_bytes_arriving_on_an_idle_connection_make_it_unusable(serve):
    server = serve()
    pool = pool_for(server)
    pool.send(headers_for(server), b"")
    (idle,) = pool._idle
    wait_for(lambda: len(server._clients) == 1)
    server._clients[0].sendall(b"HTTP/1.1 200 OK\r\n")  # stray bytes, after the answer was read
    wait_for(lambda: not quiet(idle))
    assert pool._take() is None  # dropped, not handed out
    assert idle.reader.raw.sock.fileno() == -1


def quiet(connection) -> bool:
    """Nothing to read on the connection's socket."""
    import select

    poller = select.poll()
    poller.register(connection.reader.raw.sock, select.POLLIN)
    return not poller.poll(0)


def test_an_idle_connection_the_server_closed_is_not_reused(serve):
    server = serve((OK, True))
    pool = pool_for(server)
    assert pool.send(headers_for(server), b"").body == b"{}"  # answered, then closed by the server
    wait_for(lambda: not quiet(pool._idle[0]))
    assert pool.send(headers_for(server), b"").body == b"{}"
    assert server.connections == 2 and pool.resent == 0  # seen closed before reuse: no re-send needed


def test_connections_on_descriptors_past_1024_are_still_reused(serve):
    # select() refuses descriptors past FD_SETSIZE: an idle-connection check built on it would call every
    # connection dead once the process holds many files, and open a new one per request.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("cannot hold 1100 descriptors here")
    if soft != resource.RLIM_INFINITY and soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048 if hard == resource.RLIM_INFINITY else min(2048, hard),
                                                    hard))
    held = [open(os.devnull) for _ in range(1100)]  # noqa: SIM115 - closed below
    try:
        server = serve()
        pool = pool_for(server)
        for _ in range(3):
            pool.send(headers_for(server), b"")
        assert pool._idle[0].reader.raw.sock.fileno() > 1024
        assert pool.opened == 1 and server.connections == 1
    finally:
        for f in held:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_kept_connection_sets_its_timeout_and_makes_its_poll_object_once(serve, monkeypatch):
    # Each settimeout is a system call: made when the value changes, not for every write and read; and the
    # idle check asks one poll object a connection, made when it connects.
    import select as select_module

    server = serve()
    pool = pool_for(server)
    made = []
    real_poll = select_module.poll
    monkeypatch.setattr(select_module, "poll", lambda: made.append(1) or real_poll())
    pool.send(headers_for(server), b"")
    connection = pool._idle[0]
    timed = connection.reader.raw
    calls = []
    real = timed.sock.settimeout
    monkeypatch.setattr(timed, "sock", types.SimpleNamespace(
        settimeout=lambda value: calls.append(value) or real(value), gettimeout=timed.sock.gettimeout,
        fileno=timed.sock.fileno, recv_into=timed.sock.recv_into), raising=True)
    for _ in range(5):
        assert pool.send(headers_for(server), b"").body == b"{}"
    assert calls == [] and made == [1] and pool.opened == 1
    budget = Budget()
    budget.attempt(0.5)  # a deadline shorter than the read timeout: every write and read is bounded by it
    assert pool.send(headers_for(server), b"", budget).body == b"{}"
    assert len(calls) >= 2 and all(0 < value <= 0.5 for value in calls)
    assert timed.timeout == calls[-1]


def test_every_connection_has_nodelay_and_keepalive_when_asked(serve):
    server = serve()
    for keepalive in (False, True):
        pool = pool_for(server, tcp_keepalive=keepalive)
        pool.send(headers_for(server), b"")
        sock = pool._idle[0].reader.raw.sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)) is keepalive


# -- early answers ---------------------------------------------------------------------------------------------


class EarlyAnswerServer:
    """Like DynamoDB's front end for a request it refuses on sight: a body over `limit` bytes gets `answer` as
    soon as the head is read, and the connection is closed with the body unread (the client sees a reset);
    smaller requests are answered OK, kept alive. Records the sizes announced."""

    def __init__(self, limit: int, answer: bytes, tls=None):
        self.limit = limit
        self.answer = answer
        self.sizes: list[int] = []
        self._tls = tls
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.netloc = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.endpoint = f"{'https' if tls else 'http'}://{self.netloc}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        for client in accepted(self._listener, self._tls):
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _connection(self, client):
        reader = client.makefile("rb")
        try:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    byte = reader.read(1)
                    if not byte:
                        return
                    head += byte
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                self.sizes.append(length)
                if length > self.limit:
                    client.sendall(self.answer)
                    return  # closed with the body unread
                reader.read(length)
                client.sendall(OK)
        except OSError:
            return
        finally:
            reader.close()
            client.close()

    def close(self):
        stop_listening(self._listener)


TOO_LARGE = b'{"__type":"ValidationException","message":"Item size has exceeded the maximum allowed size"}'
TOO_LARGE_ANSWER = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(TOO_LARGE), TOO_LARGE)


def test_an_answer_sent_before_the_body_was_read_is_the_answer():
    server = EarlyAnswerServer(64 * 1024, TOO_LARGE_ANSWER)
    try:
        pool = make_pool(server.endpoint, connect_timeout=2, read_timeout=5)
        answer = pool.send({"Host": server.netloc}, b"x" * (8 * 1024 * 1024))
        assert (answer.status, answer.body) == (400, TOO_LARGE) and len(server.sizes) == 1
        assert pool.send({"Host": server.netloc}, b"{}").body == b"{}"
        assert pool.opened == 2  # the connection of the early answer was not kept
    finally:
        server.close()


def test_an_early_answer_over_tls_is_the_answer_or_a_lost_connection(own_ca):
    # Over TLS a failed write may leave OpenSSL unable to read what came before it: the request then fails as a
    # lost connection (sent, so uncertain), never with another answer.
    server = EarlyAnswerServer(64 * 1024, TOO_LARGE_ANSWER, tls=own_ca["context"])
    try:
        pool = make_pool(server.endpoint, connect_timeout=2, read_timeout=5, cafile=own_ca["ca"])
        try:
            answer = pool.send({"Host": server.netloc}, b"x" * (8 * 1024 * 1024))
        except SendError as error:
            assert error.code in ("ConnectionClosedError", "SSLError") and error.sent, error
        else:
            assert (answer.status, answer.body) == (400, TOO_LARGE)
        assert len(server.sizes) == 1 and pool.resent == 0
        assert pool.send({"Host": server.netloc}, b"{}").body == b"{}"
    finally:
        server.close()


# -- the one free re-send after a dead kept-alive connection -----------------------------------------------


class DroppingServer:
    """On every connection: the first request gets `first` (kept alive, sent `later_delay` seconds late on all
    connections but the first); the next one is read and the connection closed without an answer, as a server
    that dropped it while idle. Counts requests."""

    def __init__(self, first: bytes = OK, later_delay: float = 0.0):
        self.first = first
        self.later_delay = later_delay
        self.requests = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.netloc = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.endpoint = f"http://{self.netloc}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        for client in accepted(self._listener, None):
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _read(self, reader) -> bool:
        if read_request(reader) is None:
            return False
        with self._lock:
            self.requests += 1
        return True

    def _connection(self, client):
        with self._lock:
            self.connections += 1
            later = self.connections > 1
        reader = client.makefile("rb")
        try:
            if self._read(reader):
                if later:
                    time.sleep(self.later_delay)
                client.sendall(self.first)
                self._read(reader)
        except OSError:
            pass
        finally:
            reader.close()
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            client.close()

    def close(self):
        stop_listening(self._listener)


@pytest.fixture
def dropping():
    yield from _started(DroppingServer)


def test_a_dead_kept_alive_connection_is_sent_once_more_on_a_new_one(dropping):
    server = dropping()
    pool = pool_for(server)
    assert pool.send({"Host": server.netloc}, b"").body == b"{}"
    assert pool.send({"Host": server.netloc}, b"").body == b"{}"  # dead, then sent on a new connection
    assert server.requests == 3 and pool.resent == 1 and pool.opened == 2


def test_the_free_re_send_is_one_per_budget_however_many_attempts(dropping):
    server = dropping()
    pool = pool_for(server)
    pool.send({"Host": server.netloc}, b"")
    budget = Budget()
    budget.attempt(5)
    assert pool.send({"Host": server.netloc}, b"", budget).body == b"{}"  # the re-send, used
    budget.attempt(5)  # the next attempt of the same call
    with pytest.raises(SendError) as caught:
        pool.send({"Host": server.netloc}, b"", budget)
    assert (caught.value.code, caught.value.sent) == ("ConnectionClosedError", True)
    assert server.requests == 4 and pool.resent == 1


def test_a_request_lost_on_a_dead_connection_may_have_been_applied_though_the_re_send_never_connected(dropping):
    server = dropping()
    pool = pool_for(server)
    assert pool.send({"Host": server.netloc}, b"").body == b"{}"  # its connection kept
    server.close()  # nothing listens any more: the re-send's connect is refused
    with pytest.raises(SendError) as caught:
        pool.send({"Host": server.netloc}, b"")
    # The request went out on the kept connection, which the server read and closed: it may have been applied,
    # though the last thing that failed was a connect.
    assert (caught.value.code, caught.value.sent) == ("EndpointConnectionError", True)
    assert server.requests == 2 and pool.resent == 1


def test_the_re_send_ends_within_the_attempts_time(dropping):
    server = dropping(later_delay=3.0)
    pool = pool_for(server, read_timeout=5)
    pool.send({"Host": server.netloc}, b"")
    budget = Budget()
    budget.attempt(0.4)
    started = time.monotonic()
    with pytest.raises(SendError) as caught:
        pool.send({"Host": server.netloc}, b"", budget)
    elapsed = time.monotonic() - started
    assert (caught.value.code, caught.value.sent) == ("ReadTimeoutError", True)
    assert pool.resent == 1 and server.requests == 3
    assert elapsed < 2.0, elapsed  # the attempt's 0.4 s, not the 3 s delay nor the 5 s read timeout


def test_a_fresh_connection_that_fails_is_never_sent_again_for_free(serve):
    server = serve((b"", True))
    with pytest.raises(SendError) as caught:
        pool = pool_for(server)
        pool.send(headers_for(server), b"")
    assert (caught.value.code, caught.value.sent) == ("ConnectionClosedError", True) and pool.resent == 0
    assert len(server.requests) == 1


class ResettingServer:
    """The first request on a connection gets a whole answer, kept alive; the next gets `partial` bytes of an
    answer and then a reset (RST). Counts requests."""

    def __init__(self, partial: bytes):
        self.partial = partial
        self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.netloc = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.endpoint = f"http://{self.netloc}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        for client in accepted(self._listener, None):
            with client:
                reader = client.makefile("rb")
                for n in range(2):
                    if read_request(reader) is None:
                        break
                    self.requests += 1
                    if n == 0:
                        client.sendall(OK)
                    else:
                        client.sendall(self.partial)
                        time.sleep(0.05)  # the bytes reach the client before the reset
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                        break
                reader.close()

    def close(self):
        stop_listening(self._listener)


@pytest.mark.parametrize("partial", [b"HTTP/1.1 200 O", b"HTTP/1.1 200 OK\r\nContent-Le",
                                     b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}"])
def test_part_of_an_answer_then_a_reset_is_not_sent_again(partial):
    # The server read the request and began answering: it may have applied it. That is an uncertain failure
    # for the retry rules to weigh, never the free re-send of a connection found dead.
    server = ResettingServer(partial)
    try:
        pool = make_pool(server.endpoint, connect_timeout=2, read_timeout=2)
        assert pool.send({"Host": server.netloc}, b"").body == b"{}"
        with pytest.raises(SendError) as caught:
            pool.send({"Host": server.netloc}, b"")
        assert (caught.value.code, caught.value.sent) == ("ConnectionClosedError", True)
        assert server.requests == 2 and pool.resent == 0
    finally:
        server.close()


# -- timeouts --------------------------------------------------------------------------------------------------


@pytest.fixture
def listener():
    """A socket that accepts (in the kernel's backlog) and never answers; what a test accepts it closes."""
    sock = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    yield sock, held
    for client in held:
        client.close()
    sock.close()


def test_a_stalled_answer_is_dropped_after_the_read_timeout(listener):
    sock, _ = listener
    endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    pool = make_pool(endpoint, connect_timeout=2, read_timeout=0.3)
    budget = Budget()
    budget.attempt(30)  # plenty left: the read timeout alone ends the wait
    started = time.monotonic()
    with pytest.raises(SendError) as caught:
        pool.send({"Host": "h"}, b"{}", budget)
    assert time.monotonic() - started < 2.5
    assert (caught.value.code, caught.value.sent) == ("ReadTimeoutError", True)
    assert str(caught.value) == f'Read timeout on endpoint URL: "{endpoint}/"'


def test_a_trickled_answer_is_cut_at_the_attempts_end(listener):
    # One byte every 50 ms never trips a 1 s read timeout; the attempt's end still stops it.
    sock, held = listener
    stop = threading.Event()

    def serve():
        client, _ = sock.accept()
        held.append(client)
        client.recv(65536)
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 60\r\n\r\n" + b" " * 60:
            if stop.is_set():
                return
            with contextlib.suppress(OSError):
                client.sendall(bytes([byte]))
            time.sleep(0.05)

    threading.Thread(target=serve, daemon=True).start()
    pool = make_pool(f"http://127.0.0.1:{sock.getsockname()[1]}", connect_timeout=2, read_timeout=1)
    budget = Budget()
    budget.attempt(0.5)
    started = time.monotonic()
    try:
        with pytest.raises(SendError) as caught:
            pool.send({"Host": "h"}, b"{}", budget)
    finally:
        stop.set()
    assert (caught.value.code, caught.value.sent) == ("ReadTimeoutError", True)
    assert time.monotonic() - started < 2.0  # not the 5 s of trickle


def _trickle(sock, held, stop, answer: bytes, pause: float) -> None:
    client, _ = sock.accept()
    held.append(client)
    client.recv(65536)
    for byte in answer:
        if stop.is_set():
            return
        with contextlib.suppress(OSError):
            client.sendall(bytes([byte]))
        time.sleep(pause)


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n" + b" " * 200,
    b"HTTP/1.1 100 Continue\r\n\r\n" * 40 + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
], ids=["bytes", "interim answers"])
def test_without_a_deadline_an_attempt_still_ends_after_the_connect_and_read_timeouts(listener, answer):
    # A hostile review held a claim (which carries no deadline) 46 s with one byte every 0.2 s, and 50 s with a
    # stream of 100 Continue: every read came within the read timeout, and nothing bounded their sum.
    sock, held = listener
    stop = threading.Event()
    threading.Thread(target=_trickle, args=(sock, held, stop, answer, 0.02), daemon=True).start()
    pool = make_pool(f"http://127.0.0.1:{sock.getsockname()[1]}", connect_timeout=0.3, read_timeout=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(SendError) as caught:
            pool.send({"Host": "h"}, b"{}")
    finally:
        stop.set()
    assert (caught.value.code, caught.value.sent) == ("ReadTimeoutError", True)
    assert time.monotonic() - started < 2.5  # 0.8 s at most, not the trickle's 4 s


def test_without_time_to_write_nothing_is_sent(serve):
    server = serve()
    pool = pool_for(server)
    pool.send(headers_for(server), b"")  # a kept connection: no connect needed
    budget = Budget()
    budget.attempt(0)
    with pytest.raises(SendError) as caught:
        pool.send(headers_for(server), b"", budget)
    assert (caught.value.code, caught.value.sent) == ("ReadTimeoutError", False)
    assert len(server.requests) == 1


def test_no_time_to_connect_is_a_connect_timeout_before_connecting(listener):
    sock, _ = listener
    pool = make_pool(f"http://127.0.0.1:{sock.getsockname()[1]}", connect_timeout=2, read_timeout=2)
    budget = Budget()
    budget.attempt(0)
    with pytest.raises(SendError) as caught:
        pool.send({"Host": "h"}, b"", budget)
    assert (caught.value.code, caught.value.sent) == ("ConnectTimeoutError", False) and pool.opened == 0


def test_a_handshake_that_never_ends_is_a_connect_timeout(listener, own_ca):
    sock, _ = listener
    endpoint = f"https://127.0.0.1:{sock.getsockname()[1]}"
    pool = make_pool(endpoint, connect_timeout=0.3, read_timeout=5, cafile=own_ca["ca"])
    started = time.monotonic()
    with pytest.raises(SendError) as caught:
        pool.send({"Host": "h"}, b"")
    assert time.monotonic() - started < 2.5
    assert (caught.value.code, caught.value.sent) == ("ConnectTimeoutError", False)
    assert str(caught.value) == f'Connect timeout on endpoint URL: "{endpoint}/"'


def test_the_tls_handshake_gets_only_what_the_attempt_has_left(listener, own_ca, monkeypatch):
    # A connect that took most of the attempt must not hand the handshake the whole connect timeout again.
    sock, _ = listener
    real = socket.create_connection

    def slow(address, timeout=None, *args, **kwargs):
        time.sleep(0.6)  # a SYN lost once and sent again
        return real(address, timeout, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", slow)
    pool = make_pool(f"https://127.0.0.1:{sock.getsockname()[1]}", connect_timeout=5, read_timeout=5,
                     cafile=own_ca["ca"])
    budget = Budget()
    budget.attempt(1.0)
    started = time.monotonic()
    with pytest.raises(SendError) as caught:
        pool.send({"Host": "h"}, b"", budget)
    assert (caught.value.code, caught.value.sent) == ("ConnectTimeoutError", False)
    assert time.monotonic() - started < 2.5  # not the 5 s connect timeout again


# -- errors before anything is sent ----------------------------------------------------------------------------


def test_a_refused_connect_is_an_endpoint_connection_error():
    sock = socket.create_server(("127.0.0.1", 0))
    endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    with pytest.raises(SendError) as caught:
        make_pool(endpoint, connect_timeout=2, read_timeout=2).send({"Host": "h"}, b"")
    assert (caught.value.code, caught.value.sent) == ("EndpointConnectionError", False)
    assert str(caught.value) == f'Could not connect to the endpoint URL: "{endpoint}/"'


def test_an_ipv6_literal_endpoint_is_reached():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        sock = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback")
    port = sock.getsockname()[1]
    got = []

    def serve():
        client, _ = sock.accept()
        with client:
            got.append(read_request(client.makefile("rb")))
            client.sendall(OK)

    threading.Thread(target=serve, daemon=True).start()
    try:
        pool = make_pool(f"http://[::1]:{port}", connect_timeout=2, read_timeout=2)
        answer = pool.send({"Host": f"[::1]:{port}"}, b"")
        assert answer.body == b"{}" and got[0][0].startswith(b"POST / HTTP/1.1\r\nHost: [::1]:")
    finally:
        sock.close()


# -- TLS on loopback, with a CA of our own ---------------------------------------------------------------------


def test_https_with_the_trusted_ca_keeps_its_connection(serve, own_ca):
    server = serve(tls=own_ca["context"])
    pool = pool_for(server, cafile=own_ca["ca"])
    for _ in range(3):
        assert pool.send(headers_for(server), b"{}").body == b"{}"
    assert len(server.requests) == 3 and server.connections == 1 and pool.opened == 1
    context = pool._context
    pool.send(headers_for(server), b"{}")
    assert pool._context is context  # built once


def test_a_certificate_no_trusted_ca_signed_is_a_clear_error_before_sending(serve, own_ca):
    server = serve(tls=own_ca["context"])
    with pytest.raises(SendError) as caught:
        pool_for(server, cafile=own_ca["other"]).send(headers_for(server), b"")
    error = caught.value
    assert (error.code, error.sent) == ("SSLError", False) and "CERTIFICATE_VERIFY_FAILED" in str(error)
    assert server.endpoint in str(error) and own_ca["other"] in str(error)
    assert server.requests == []


def test_a_ca_bundle_that_cannot_be_loaded_fails_before_connecting(serve, own_ca, tmp_path):
    server = serve(tls=own_ca["context"])
    with pytest.raises(SendError) as caught:
        pool_for(server, cafile=str(tmp_path / "missing.pem")).send(headers_for(server), b"")
    assert (caught.value.code, caught.value.sent) == ("SSLError", False)
    assert "cannot load the CA bundle" in str(caught.value) and "missing.pem" in str(caught.value)
    time.sleep(0.1)
    assert server.connections == 0  # not even connected


def test_the_server_name_checked_is_the_endpoints_host(serve, own_ca):
    # The certificate names 127.0.0.1: reached as "localhost", the name does not match.
    server = serve(tls=own_ca["context"])
    pool = make_pool(f"https://localhost:{server.port}", connect_timeout=2, read_timeout=2, cafile=own_ca["ca"])
    with pytest.raises(SendError) as caught:
        pool.send({"Host": "localhost"}, b"")
    assert caught.value.code == "SSLError" and caught.value.sent is False


_IMPORTS = """
import sys
sys.path.insert(0, sys.argv[1])
from idempotency_layer.stores.dynamodb import connection
try:
    connection.Pool(sys.argv[2], connect_timeout=1, read_timeout=1).send({"Host": "h"}, b"")
except connection.SendError as error:
    print(error.code, "idempotency_layer.aws.trust" in sys.modules)
"""


@pytest.mark.parametrize(("scheme", "printed"), [("http", "EndpointConnectionError False"),
                                                 ("https", "EndpointConnectionError True")])
def test_the_tls_context_is_built_only_for_https(scheme, printed):
    import sys
    from pathlib import Path

    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # refused: the https pool builds its context first, then fails to connect
    layer = Path(__file__).resolve().parents[2] / "layer"
    run = subprocess.run([sys.executable, "-I", "-c", _IMPORTS, str(layer), f"{scheme}://127.0.0.1:{port}"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == printed


# -- proxies ---------------------------------------------------------------------------------------------------


class Proxy:
    """An HTTP proxy: CONNECT tunnels to the named host:port, an absolute-URL request is forwarded there.
    Records each request head it receives; with `refuse`, answers CONNECT with 407 and closes."""

    def __init__(self, refuse: bool = False, trickle: float = 0.0, after_answer: bytes = b""):
        self.refuse = refuse
        self.trickle = trickle  # seconds between the bytes of the CONNECT answer (0: all at once)
        self.after_answer = after_answer  # bytes sent right after the CONNECT answer
        self.heads: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _connection(self, client):
        with contextlib.suppress(OSError):
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                byte = client.recv(1)
                if not byte:
                    client.close()
                    return
                head += byte
            self.heads.append(head)
            method, target = head.split(b" ")[:2]
            if method == b"CONNECT":
                if self.refuse:
                    client.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
                    client.close()
                    return
                host, _, port = target.decode().rpartition(":")
                upstream = socket.create_connection((host, int(port)))
                established = b"HTTP/1.1 200 Connection established\r\nX-Pad: " + b"p" * 200 + b"\r\n\r\n"
                if self.trickle:
                    for byte in established:
                        client.sendall(bytes([byte]))
                        time.sleep(self.trickle)
                else:
                    client.sendall(established + self.after_answer)
            else:  # forwarded as it came: the upstream test server reads the absolute target
                netloc = target.decode().split("/")[2]
                host, _, port = netloc.rpartition(":")
                upstream = socket.create_connection((host, int(port)))
                upstream.sendall(head)
            self._sockets.append(upstream)
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
            self._pipe(client, upstream)

    @staticmethod
    def _pipe(source, sink):
        with contextlib.suppress(OSError):
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self):
        stop_listening(self._listener)
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def proxy():
    yield from _started(Proxy)


def header(head: bytes, name: bytes) -> list[bytes]:
    return [line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")[1:]
            if line.lower().startswith(name.lower() + b":")]


def test_https_goes_through_a_connect_tunnel_with_basic_credentials(serve, own_ca, proxy):
    server = serve(tls=own_ca["context"])
    tunnel = proxy()
    pool = make_pool(server.endpoint, connect_timeout=2, read_timeout=2, cafile=own_ca["ca"],
                proxy=f"http://us%20er:p%40ss:w@127.0.0.1:{tunnel.port}")
    for _ in range(2):
        assert pool.send(headers_for(server), b"{}").body == b"{}"
    assert len(tunnel.heads) == 1 and pool.opened == 1  # the tunnel is kept alive
    connect = tunnel.heads[0]
    assert connect.startswith(f"CONNECT {server.netloc} HTTP/1.".encode())
    assert header(connect, b"Host") == [server.netloc.encode()]
    assert header(connect, b"Proxy-Authorization") == [b"Basic " + base64.b64encode(b"us er:p@ss:w")]
    head, _ = server.requests[0]
    assert head.startswith(b"POST / HTTP/1.1\r\n") and header(head, b"Host") == [server.netloc.encode()]
    assert header(head, b"Proxy-Authorization") == []  # inside the tunnel the proxy sees nothing


def test_http_is_forwarded_with_the_absolute_url_as_target(serve, proxy):
    server = serve()
    forwarder = proxy()
    pool = make_pool(server.endpoint + "/p", connect_timeout=2, read_timeout=2,
                proxy=f"http://u:pw@127.0.0.1:{forwarder.port}")
    assert pool.send(headers_for(server), b"{}").body == b"{}"
    head = forwarder.heads[0]
    assert head.startswith(f"POST http://{server.netloc}/p HTTP/1.1\r\n".encode())
    assert header(head, b"Host") == [server.netloc.encode()]  # the endpoint's, not the proxy's
    assert header(head, b"Proxy-Authorization") == [b"Basic " + base64.b64encode(b"u:pw")]


def test_a_refused_connect_is_a_proxy_connection_error_naming_no_password(serve, own_ca, proxy):
    server = serve(tls=own_ca["context"])
    refusing = proxy(refuse=True)
    pool = make_pool(server.endpoint, connect_timeout=2, read_timeout=2, cafile=own_ca["ca"],
                proxy=f"http://user:hunter2@127.0.0.1:{refusing.port}")
    with pytest.raises(SendError) as caught:
        pool.send(headers_for(server), b"")
    assert (caught.value.code, caught.value.sent) == ("ProxyConnectionError", False)
    assert str(caught.value) == f'Failed to connect to proxy URL: "http://127.0.0.1:{refusing.port}"'
    assert server.requests == [] and pool.opened == 0


def test_a_connect_answer_trickled_a_byte_at_a_time_ends_with_the_attempt(serve, own_ca, proxy):
    # A hostile review's proxy sent its CONNECT answer a byte every 0.2 s: each read came within the connect
    # timeout, so a completion took 48.7 s against a 5 s deadline and a claim 73 s.
    server = serve(tls=own_ca["context"])
    slow = proxy(trickle=0.05)  # 250 bytes: 12.5 s
    pool = make_pool(server.endpoint, connect_timeout=0.5, read_timeout=0.5, cafile=own_ca["ca"],
                     proxy=f"http://127.0.0.1:{slow.port}")
    started = time.monotonic()
    with pytest.raises(SendError) as caught:
        pool.send(headers_for(server), b"{}")
    assert (caught.value.code, caught.value.sent) == ("ProxyConnectionError", False)
    assert time.monotonic() - started < 2.5  # the attempt's 1 s, not the trickle's 12.5 s
    assert server.requests == []


def test_bytes_after_the_connect_answer_are_a_proxy_connection_error(serve, own_ca, proxy):
    # No TLS server speaks before the client's hello: bytes there are not the endpoint's.
    server = serve(tls=own_ca["context"])
    odd = proxy(after_answer=b"\x16\x03\x01 not a handshake")
    pool = make_pool(server.endpoint, connect_timeout=2, read_timeout=2, cafile=own_ca["ca"],
                     proxy=f"http://127.0.0.1:{odd.port}")
    with pytest.raises(SendError) as caught:
        pool.send(headers_for(server), b"{}")
    assert (caught.value.code, caught.value.sent) == ("ProxyConnectionError", False)


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_a_proxy_that_cannot_be_reached_is_a_proxy_connection_error(scheme):
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    pool = make_pool(f"{scheme}://127.0.0.1:1", connect_timeout=2, read_timeout=2, proxy=f"http://127.0.0.1:{port}")
    with pytest.raises(SendError) as caught:
        pool.send({"Host": "127.0.0.1:1"}, b"")
    assert (caught.value.code, caught.value.sent) == ("ProxyConnectionError", False)


@pytest.mark.parametrize("url", ["https://user:hunter2@proxy:3128", "socks5://user:hunter2@proxy:1080",
                                 "user:hunter2@proxy:3128"])
def test_a_proxy_url_that_is_not_http_is_refused_naming_no_password(url):
    with pytest.raises(ValueError) as caught:
        make_pool("https://dynamodb.example", connect_timeout=1, read_timeout=1, proxy=url)
    assert "hunter2" not in str(caught.value) and "http://" in str(caught.value)
    assert url.partition(":")[0] in str(caught.value) or "://" not in url


# -- fork ------------------------------------------------------------------------------------------------------


def test_a_forked_child_opens_its_own_connections(serve):
    # Parent and child sharing a kept-alive connection could each read the other's answer.
    server = serve()
    pool = pool_for(server)
    assert pool.send(headers_for(server), b"").body == b"{}"
    before = list(pool._idle)
    pid = os.fork()
    if pid == 0:  # the child: nothing of the parent's pool is handed out, and its copies are closed
        try:
            fine = pool._idle == [] and all(c.reader.raw.sock.fileno() == -1 for c in before)
            fine = fine and pool._lock.acquire(blocking=False)
        except BaseException:
            fine = False
        os._exit(0 if fine else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pool.send(headers_for(server), b"").body == b"{}"  # the parent's connection untouched and reused
    assert server.connections == 1
