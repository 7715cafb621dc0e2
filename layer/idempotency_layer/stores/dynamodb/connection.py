"""Kept-alive HTTP/1.1 connections to one endpoint, on CPython's `http.client`.

`Pool.send` POSTs one request and returns its `Answer`, or raises `SendError`. http.client writes the request
and parses the answer (status line, headers, 100 Continue, Content-Length, chunked, to-the-close); this module
adds what the layer needs around it, one concern per part below:

    Pool.send ──> _take (an idle connection, checked by _alive) or _new (connect, proxy tunnel, TLS)
              ──> _exchange: putrequest/putheader/endheaders (head and body in one write)
                             getresponse, read ──> Reader (a BufferedReader of ours)
                                                  ──> Timed (the read timeout rule) ──> socket
              ──> _give back (the keep-alive rule) or drop

One connection (`Connection`, with its `Reader` and `Timed`) is in http_connection.py; the pool, its rules and
its errors are here.

Keep-alive rule (`_exchange`, `_alive`): a connection goes back to the pool only when its answer was read to
its exact end (nothing buffered after it, nothing decrypted and pending, no end of stream seen), the answer did
not say it closes, and the whole request was written. An idle connection with anything to read (an end of
stream or stray bytes) is dropped before reuse. So an answer is always the one to the request just written.

Timeout rule (`send` for the attempt's end, `_new` for connecting, `Timed.readinto` for reading): an attempt
ends at `Budget.end`, which the caller's deadline sets, or else the connect timeout plus the read timeout after
it starts; connecting gets min(connect timeout, what the attempt has left), and so does each read of a proxy's
CONNECT answer, which ends with the attempt too; the TLS handshake gets what is left after that; writing the
request gets min(read timeout, what is left); EVERY read of the answer waits at most the read timeout and never
past the attempt's end: a stalled answer is dropped after the read timeout, and one trickled a byte (or an
interim 1xx answer) at a time cannot hold the attempt past its end.

Error model (`SendError` and the `_..._error` constructors of `Pool`): codes are botocore's exception names;
`sent` says whether the request may have reached the server. Messages name the endpoint, never request or
answer content. A kept-alive connection found dead before any byte of an answer is sent once more on a new
connection (`Budget.resend`): that is not a retry, and its failure is reported with sent=True.

Only https endpoints import `ssl` here (http.client imports it anyway when it is importable).
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import sys
import threading
import time
from collections import namedtuple
from collections.abc import Iterator, Mapping
from urllib.parse import unquote, urlsplit

from ...aws.target import request_target
from .http_connection import Connection

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, NamedTuple

_MAX_IDLE = 10  # batch claims run up to 10 requests at once (sources/batch.py)
# The largest answer read: the layer's requests are answered with at most one item (400 KB, its binary values in
# base64), far below this; a length above it (a broken or hostile peer) is a broken answer, never an allocation.
_MAX_ANSWER = 4 * 1024 * 1024


class SendError(Exception):
    """A request that got no answer. `code`: the botocore exception name (EndpointConnectionError,
    ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError, SSLError, ProxyConnectionError, HTTPClientError).
    `sent`: the request may have reached the server (so may have been applied)."""

    def __init__(self, code: str, message: str, sent: bool) -> None:
        super().__init__(message)
        self.code = code
        self.sent = sent


if TYPE_CHECKING:
    class _AnswerFields(NamedTuple):
        status: int
        headers: Headers  # a read-only mapping: names in any case, a repeated header's values joined with ", "
        body: bytes
else:
    _AnswerFields = namedtuple("Answer", ("status", "headers", "body"))


class Answer(_AnswerFields):
    __slots__ = ()


class Budget:
    """What one call may still spend: the end of the current attempt (None: `Pool.send` gives it the pool's
    `attempt_s`) and whether its one free re-send on a new connection is still unused."""

    __slots__ = ("end", "resend")

    def __init__(self) -> None:
        self.end: float | None = None
        self.resend = True

    def attempt(self, left: float | None) -> None:
        self.end = None if left is None else time.monotonic() + left

    def cut(self, timeout: float) -> float:
        """`timeout`, cut to what the attempt has left; 0 when nothing is."""
        if self.end is None:
            return timeout
        return max(0.0, min(timeout, self.end - time.monotonic()))


def after_fork(owner: Any, forget: Any) -> None:
    """Call `forget(owner)` in a child process after a fork, for as long as `owner` lives."""
    import weakref

    ref = weakref.ref(owner)

    def in_child() -> None:
        alive = ref()
        if alive is not None:
            forget(alive)

    os.register_at_fork(after_in_child=in_child)


def _alive(connection: Connection) -> bool:
    # An idle connection with anything to read (buffered, or on the socket) has been closed (EOF) or is out of
    # step: either way unusable.
    if connection.ahead():
        return False
    try:
        # poll, not select: select refuses descriptors past FD_SETSIZE (1024), which a process holding many
        # files reaches, and every idle connection would then look dead. One poll object a connection.
        return not connection.poller.poll(0)
    except (OSError, ValueError):
        return False


class _Stale(Exception):
    """The connection was closed before any byte of the answer: the server dropped it while idle."""


class _Malformed(Exception):
    """An answer http.client read but that cannot be taken as one (cut short, or an unusable Content-Length)."""


# What a peer's close looks like on send or before the status line (RemoteDisconnected is a ConnectionResetError).
_CLOSED = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_FOLD = re.compile(r"\r?\n[ \t]+")


def _is_ssl_error(error: BaseException) -> bool:
    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(error, ssl.SSLError)


def _is_ssl_eof(error: BaseException) -> bool:
    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(error, (ssl.SSLEOFError, ssl.SSLZeroReturnError))


# -- the pool --------------------------------------------------------------------------------------------------


class Pool:
    """Kept-alive HTTP/1.1 connections to one endpoint: a lock-protected pool of up to 10 idle ones, shared by
    threads, one request at a time per connection; in a forked child the idle ones are forgotten."""

    def __init__(self, endpoint: str, *, connect_timeout: float, read_timeout: float,
                 cafile: str | None = None, proxy: str | None = None, tcp_keepalive: bool = False) -> None:
        """endpoint: scheme://host[:port][/path][?query] (http or https; IPv6 literal hosts in brackets allowed).
        Requests POST to its `target.request_target`. cafile: for https, the CA bundle (None: OpenSSL defaults,
        as tls_context does). proxy: an http:// proxy URL, possibly with user:password@ (Basic
        Proxy-Authorization), or None."""
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the endpoint must be an http:// or https:// URL with a host")
        if parts.username is not None:
            raise ValueError("the endpoint URL must hold no user")
        self._https = parts.scheme == "https"
        self._host = parts.hostname  # without brackets: what is connected to, and TLS's server name
        self._port = parts.port or (443 if self._https else 80)
        self._target = request_target(endpoint).wire  # as botocore sends it: path and query, encoded as urllib3 does
        self._netloc = parts.netloc
        self._url = f"{parts.scheme}://{parts.netloc}{self._target}"
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        # An attempt's time when no deadline cuts it: connecting and every read together.
        self.attempt_s = connect_timeout + read_timeout
        self._cafile = cafile
        self._keepalive = tcp_keepalive
        # Where connections go: the endpoint, or the proxy (which tunnels https and forwards http).
        self._address = (self._host, self._port)
        self._proxy_url: str | None = None
        self._proxy_headers: dict[str, str] = {}  # Proxy-Authorization, when the proxy URL holds credentials
        self._tunnel = False
        if proxy is not None:
            self._proxy(proxy, parts.netloc)
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._context: Any = None
        self.opened = 0  # connections opened, for tests
        self.resent = 0  # requests sent again on a new connection after a kept-alive one was found dead
        after_fork(self, Pool._forget)

    def _proxy(self, proxy: str, netloc: str) -> None:
        scheme = proxy.partition("://")[0] if "://" in proxy else ""
        if scheme.lower() != "http":
            shown = scheme if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,15}", scheme) else "none"
            raise ValueError(f"proxy URL scheme {shown!r} is not supported: the proxy must be an http:// URL")
        parts = urlsplit(proxy)
        if not parts.hostname:
            raise ValueError("the proxy URL has no host")
        self._address = (parts.hostname, parts.port or 80)
        self._proxy_url = f"http://{parts.netloc.rpartition('@')[2]}"  # never the credentials
        if parts.username and parts.password:  # as botocore: both, percent-decoded
            from base64 import b64encode

            pair = f"{unquote(parts.username)}:{unquote(parts.password)}".encode()
            self._proxy_headers["Proxy-Authorization"] = "Basic " + b64encode(pair).decode("ascii")
        if self._https:
            self._tunnel = True  # CONNECT host:port; the proxy sees only TLS after that
        else:
            self._target = f"http://{netloc}{self._target}"  # forwarded: the absolute URL as the target

    def _forget(self) -> None:
        # In a forked child: its idle connections are the parent's too, and the two would read each other's
        # answers. Its copies are closed (the parent's stay open) and it opens its own.
        self._lock = threading.Lock()  # another thread may have held it at the fork
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.drop()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.drop()

    # -- connecting ----------------------------------------------------------------------------------------

    def _tls(self) -> Any:
        import ssl  # only https endpoints pay for it

        if self._context is None:
            from ...aws.trust import tls_context

            try:
                self._context = tls_context(self._cafile)
            except (OSError, ssl.SSLError) as error:
                # Loaded before any connection is made: nothing was sent.
                raise SendError(
                    "SSLError", f"SSL validation failed for {self._url}: cannot load the CA bundle {self._cafile}: "
                    f"{error}", sent=False
                ) from error
        return self._context

    def _new(self, budget: Budget) -> Connection:
        context = self._tls() if self._https else None  # a bundle that cannot be loaded fails before connecting
        timeout = budget.cut(self._connect_timeout)
        if timeout <= 0:
            raise self._connect_timeout_error()
        connection = Connection(*self._address, timeout=timeout)
        try:
            if self._tunnel:
                # Host given here: http.client adds none before 3.12. Each read of the CONNECT answer waits at
                # most the connect timeout (the socket's), and all of them end with the attempt.
                tunnel_headers = {"Host": self._netloc, **self._proxy_headers}
                connection.set_tunnel(self._host, self._port, tunnel_headers)
            connection.tunnel_end = budget.end
            try:
                connection.connect()  # TCP (TCP_NODELAY set by http.client), then a proxy's CONNECT
                if not connection.tunnel_done():
                    raise OSError("bytes after the proxy's CONNECT answer")
            except (OSError, http.client.HTTPException) as error:
                if self._proxy_url is not None:
                    raise SendError(
                        "ProxyConnectionError", f'Failed to connect to proxy URL: "{self._proxy_url}"', sent=False
                    ) from error
                if isinstance(error, TimeoutError):
                    raise self._connect_timeout_error() from error
                raise self._unreachable() from error
            if self._keepalive:
                connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if context is not None:
                self._handshake(connection, context, budget)
            connection.attach()
        except BaseException:
            connection.drop()
            raise
        self.opened += 1
        return connection

    def _handshake(self, connection: Connection, context: Any, budget: Budget) -> None:
        import ssl

        # The handshake gets what the attempt has left after connecting, not the connect timeout again.
        left = budget.cut(self._connect_timeout)
        if left <= 0:
            raise self._connect_timeout_error()
        connection.sock.settimeout(left)
        try:
            connection.sock = connection.tls = context.wrap_socket(connection.sock, server_hostname=self._host)
        except ssl.SSLError as error:  # the handshake failed: no byte of the request left
            raise SendError(
                "SSLError", f"SSL validation failed for {self._url} {error} (trusted: {self._trusted()})", sent=False
            ) from error
        except TimeoutError as error:
            raise self._connect_timeout_error() from error
        except OSError as error:
            raise self._unreachable() from error

    def _trusted(self) -> str:
        return f"the CA bundle {self._cafile}, as botocore resolves it (AWS_CA_BUNDLE, REQUESTS_CA_BUNDLE, certifi)"

    # -- the pool of idle connections ----------------------------------------------------------------------

    def _take(self) -> Connection | None:
        """An idle connection still fit to use, or None; idle ones the server closed are dropped here."""
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None or _alive(connection):
                return connection
            connection.drop()

    def _give(self, connection: Connection) -> None:
        with self._lock:
            if len(self._idle) < _MAX_IDLE:
                self._idle.append(connection)
                return
        connection.drop()

    # -- one request ---------------------------------------------------------------------------------------

    def send(self, headers: dict[str, str], body: bytes, budget: Budget | None = None) -> Answer:
        """POST body with exactly these headers (the caller gives Host, signed; add only Content-Length;
        http.client must add no Host and no Accept-Encoding of its own: putrequest(skip_host=True,
        skip_accept_encoding=True))."""
        if budget is None:
            budget = Budget()
        if budget.end is None:
            # Without a deadline an attempt still ends, so an answer trickled a byte (or a 1xx) at a time cannot
            # hold it longer than the connect and read timeouts together.
            budget.end = time.monotonic() + self.attempt_s
        connection = self._take()
        if connection is None:
            try:
                return self._exchange(self._new(budget), headers, body, budget)
            except _Stale:
                raise self._closed() from None
        try:
            return self._exchange(connection, headers, body, budget)
        except _Stale:
            # A kept-alive connection the server had closed while it sat idle (a long freeze between
            # invocations) failed before any byte of an answer. It is sent once more on a new connection, which
            # is not a retry attempt: at most once per call (the budget's one re-send), within its time.
            if not budget.resend or budget.cut(self._connect_timeout) <= 0:
                raise self._closed() from None
            budget.resend = False
        self.resent += 1
        try:
            return self._exchange(self._new(budget), headers, body, budget)
        except _Stale:
            raise self._closed() from None
        except SendError as error:
            # The request went out on the dead connection first: a server may have read it before closing.
            error.sent = True
            raise

    def _head(self, connection: Connection, headers: dict[str, str], length: int) -> None:
        """Start the request in http.client (nothing is written yet)."""
        connection.putrequest("POST", self._target, skip_host=True, skip_accept_encoding=True)
        name = ""
        try:
            for name, value in headers.items():
                connection.putheader(name, value)
            for name, value in self._proxy_headers.items() if not self._tunnel else ():
                connection.putheader(name, value)
        except ValueError:  # http.client's message quotes the value, which may be a credential
            connection.drop()
            raise ValueError(f"the header {name[:64]!r} cannot be sent: not a legal HTTP header") from None
        connection.putheader("Content-Length", str(length))

    def _exchange(self, connection: Connection, headers: dict[str, str], body: bytes, budget: Budget) -> Answer:
        self._head(connection, headers, len(body))
        raw = connection.reader.raw  # type: ignore[union-attr]
        try:
            timeout = budget.cut(self._read_timeout)
            if timeout <= 0:  # the attempt's time went on connecting: nothing was sent
                raise self._read_timeout_error(sent=False)
            raw.set_timeout(timeout)  # the write's bound; each read sets its own (Timed)
            raw.end = budget.end
            raw.limit = self._read_timeout
            start = raw.received
            early = False
            try:
                connection.request_body(body)
                connection.endheaders()
            except OSError as error:
                if not (isinstance(error, _CLOSED) or _is_ssl_eof(error)):
                    raise
                # The server may have answered before reading the whole request (a 400 for a body too large)
                # and closed: that answer is read below, as urllib3 reads it, and the connection not kept. Over
                # TLS the close shows as an SSL EOF rather than a reset.
                early = True
            try:
                response = connection.getresponse()
                while 100 <= response.status < 200:  # an interim answer: http.client skips only 100 itself
                    response.read()
                    response = connection.response_class(None, method="POST")
                    response.begin()
            except OSError as error:
                if raw.received == start and (isinstance(error, _CLOSED) or _is_ssl_eof(error)):
                    raise _Stale() from error  # not one byte of an answer
                raise
            if raw.eof:  # the stream ended inside the head: a line without its end, taken short by http.client
                raise _Malformed()
            answer_headers = Headers(response.msg)
            length = answer_headers.get("content-length")
            # A Content-Length http.client ignored (not a number, negative, a list in one line) or repeated with
            # another value (it takes the first): which one frames the body is unknown.
            if length is not None and not response.chunked and (
                response.length is None or len({value.strip() for value in length.split(",")}) != 1
            ):
                raise _Malformed()
            if response.length is not None:  # Content-Length: read whole (cut short is IncompleteRead)
                if response.length > _MAX_ANSWER:
                    raise _Malformed()  # larger than any answer to the layer's requests: not read into memory
                data = response.read()
            else:  # chunked, or to the close: read up to the limit
                data = response.read(_MAX_ANSWER + 1)
                if len(data) > _MAX_ANSWER:
                    raise _Malformed()
            answer = Answer(response.status, answer_headers, data)
            # The keep-alive rule: read to its exact end, nothing after it, no close said or done.
            keep = not (early or response.will_close or raw.eof or connection.sock is None or connection.ahead())
        except _Stale:
            connection.drop()
            raise
        except TimeoutError as error:
            connection.drop()
            raise self._read_timeout_error(sent=True) from error
        except SendError:
            connection.drop()
            raise
        except (_Malformed, http.client.HTTPException):
            # Cut short or not HTTP/1.x: no answer. Not chained: IncompleteRead and BadStatusLine hold its bytes.
            connection.drop()
            raise self._closed() from None
        except (OSError, ValueError) as error:
            connection.drop()
            if _is_ssl_error(error):
                raise SendError("SSLError", f"SSL error for {self._url} {error}", sent=True) from error
            if isinstance(error, ConnectionError):
                raise self._closed() from error
            raise SendError(
                "HTTPClientError", f"An HTTP Client raised an unhandled exception: {error}", sent=True
            ) from error
        if keep:
            self._give(connection)
        else:
            connection.drop()
        return answer

    # -- errors --------------------------------------------------------------------------------------------

    def _connect_timeout_error(self) -> SendError:
        return SendError("ConnectTimeoutError", f'Connect timeout on endpoint URL: "{self._url}"', sent=False)

    def _unreachable(self) -> SendError:
        return SendError("EndpointConnectionError", f'Could not connect to the endpoint URL: "{self._url}"', sent=False)

    def _closed(self) -> SendError:
        return SendError(
            "ConnectionClosedError",
            f'Connection was closed before we received a valid response from endpoint URL: "{self._url}".',
            sent=True,
        )

    def _read_timeout_error(self, sent: bool) -> SendError:
        return SendError("ReadTimeoutError", f'Read timeout on endpoint URL: "{self._url}"', sent)


def _unfold(value: str) -> str:
    return (_FOLD.sub(" ", value) if "\n" in value else value).strip()


class Headers(Mapping):
    """An answer's headers, read when asked for (most answers are asked for one, `x-amz-crc32`): names in any
    case, a repeated header's values joined with ", ", a folded value (obs-fold) unfolded with a space."""

    __slots__ = ("_message",)

    def __init__(self, message: Any) -> None:
        self._message = message  # http.client's HTTPMessage

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def get(self, name: str, default: Any = None) -> Any:
        values = self._message.get_all(name)
        if not values:
            return default
        if len(values) == 1:  # most are: the value alone, without a join
            return _unfold(values[0])
        return ", ".join(_unfold(value) for value in values)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(name.lower() for name in self._message))

    def __len__(self) -> int:
        return sum(1 for _ in self)
