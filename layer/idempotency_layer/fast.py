"""The fast transport: the lean transport's wire protocol without botocore, for the plain Lambda zip case.

`plain_lambda(environ)` says whether the environment is that case: static credentials and a region in the
environment, and nothing that changes where or how requests go (profiles, config files, container or web
identity credentials, SnapStart's among them, FIPS or dual-stack endpoints, account-based endpoints, proxies).
Then
requests are signed by `sigv4`, sent over kept-alive HTTP/1.1 connections of our own (`Sender`), and
retried the way botocore's standard retry mode does; in every other case `transport` builds the
botocore-based lean transport as before. Only the standard library (not http.client, not ssl for http
endpoints) and orjson are imported here.
"""

from __future__ import annotations

import contextlib
import os
import random as _random
import re
import select
import socket
import sys
import threading
import time
import zlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson

from .sigv4 import Signer
from .transport import (
    _NOT_SENT,
    CHECK_FAILED,
    DynamoDBError,
    _out_of_time,
    _time_left,
    condition_item,
    crc32_ok,
    decode_answer,
    encode_body,
    unreadable,
    unreadable_error,
)

_SERVICE = "dynamodb"
_TARGET_PREFIX = "DynamoDB_20120810."
_CONTENT_TYPE = "application/x-amz-json-1.0"
_MAX_IDLE = 10  # batch claims run up to 10 requests at once (sources/batch.py)

# Regions of the `aws` partition: their DynamoDB endpoint is dynamodb.<region>.amazonaws.com. China
# (amazonaws.com.cn), GovCloud (us-gov-), the ISO partitions (us-iso-, eu-isoe-...) and anything else that
# does not match go through botocore's endpoint rules.
_AWS_REGION = re.compile(
    r"(us|af|ap|ca|eu|il|me|mx|sa)-(east|west|north|south|central|northeast|southeast|northwest|southwest)-[0-9]{1,2}"
)

# Variables that change credentials, endpoints or the HTTP path as botocore resolves them: any of them set
# (non-empty) and the botocore path is used, so behaviour stays exactly botocore's.
_BOTOCORE_VARIABLES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CREDENTIAL_EXPIRATION",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_USE_FIPS_ENDPOINT",
    "AWS_USE_DUALSTACK_ENDPOINT",
    "AWS_ACCOUNT_ID",
    "AWS_ACCOUNT_ID_ENDPOINT_MODE",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_DATA_PATH",  # botocore's data, its endpoint rules among them, from elsewhere
    "BOTOCORE_TCP_KEEPALIVE",
)


def _proxied(environ: Mapping[str, str]) -> bool:
    """A proxy variable is set: any `<scheme>_proxy` in any case, as urllib.request.getproxies_environment (which
    botocore uses) reads them; NO_PROXY alone changes nothing."""
    for name in environ:
        lower = name.lower()
        if lower.endswith("_proxy") and lower != "no_proxy":
            return True
    return False


# botocore.utils.validate_region_name: a region is a host label.
_HOST_LABEL = re.compile(r"(?![0-9]+$)(?!-)[a-zA-Z0-9-]{,63}(?<!-)")


class Plan(NamedTuple):
    """What the fast transport needs, read from the environment."""

    access_key: str
    secret_key: str
    token: str | None
    region: str
    endpoint: str  # scheme://host[:port], no path
    cafile: str | None = None  # for https: the CA bundle botocore would trust


def _raw(environ: Mapping[str, str], name: str) -> str | None:
    """The variable as botocore reads it: None when unset or empty, and `_PADDED` when a blank or padded
    value makes botocore's answer differ from what the stripped value would give."""
    value = environ.get(name)
    if not value:
        return None
    if value != value.strip():
        return _PADDED
    return value


_PADDED = "\x00padded"  # a marker: a value with surrounding white space, which botocore takes as it is


def plain_lambda(environ: Mapping[str, str]) -> Plan | None:
    """The plan for the fast transport, or None when botocore must resolve this environment.

    Values are taken as botocore takes them: not stripped. One that botocore would read differently (white
    space around it) or refuse sends the environment to botocore, which then does exactly what it does."""
    # Set at all, even empty, and botocore decides (an empty AWS_PROFILE is a profile botocore cannot find).
    if any(name in environ for name in _BOTOCORE_VARIABLES) or _proxied(environ):
        return None
    # A config file may hold a region, endpoints, a CA bundle, retry or TCP settings, and botocore reads the
    # shared credentials file's profiles for those settings too: either non-empty and botocore decides. Their
    # paths expanded as botocore expands them: variables, then `~`.
    files = (("AWS_CONFIG_FILE", "~/.aws/config"), ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"))
    for variable, default in files:
        # Set but empty, botocore reads no file at all; one it cannot read (a directory, no permission) neither.
        path = os.path.expanduser(os.path.expandvars(environ.get(variable, default)))
        try:
            with open(path, "rb") as f:
                if f.read(1):  # an empty one (or /dev/null) holds no settings
                    return None
        except OSError:
            pass
    access_key = _raw(environ, "AWS_ACCESS_KEY_ID")
    secret_key = _raw(environ, "AWS_SECRET_ACCESS_KEY")
    # botocore's order: AWS_DEFAULT_REGION (as the config chain finds it), then Lambda's AWS_REGION.
    region = _raw(environ, "AWS_DEFAULT_REGION") or _raw(environ, "AWS_REGION")
    # botocore's order: the legacy AWS_SECURITY_TOKEN first.
    token = _raw(environ, "AWS_SECURITY_TOKEN") or _raw(environ, "AWS_SESSION_TOKEN")
    configured = _raw(environ, "AWS_ENDPOINT_URL_DYNAMODB") or _raw(environ, "AWS_ENDPOINT_URL")
    read = (access_key, secret_key, region, token, configured)
    if not (access_key and secret_key and region) or _PADDED in read:
        return None
    if not _HOST_LABEL.fullmatch(region):
        return None  # botocore's validate_region_name refuses it (or the endpoint rules do)
    if configured:
        endpoint = _plain_url(configured)
        if endpoint is None:
            return None  # botocore validates it and says what is wrong
    elif _AWS_REGION.fullmatch(region):
        endpoint = f"https://dynamodb.{region}.amazonaws.com"
    else:
        return None
    cafile = None
    if endpoint.startswith("https:"):  # a CA bundle matters only to TLS: DynamoDB Local over http keeps the fast path
        cafile = ca_bundle(environ)
        if cafile is None:
            return None
    return Plan(access_key, secret_key, token, region, endpoint, cafile)


def ca_bundle(environ: Mapping[str, str]) -> str | None:
    """The CA bundle botocore would verify DynamoDB's certificate against, or None: leave it to botocore.

    The lean botocore path's resolution (`ca_bundle` from AWS_CA_BUNDLE, then REQUESTS_CA_BUNDLE, then
    botocore.httpsession.get_cert_path: certifi's cacert.pem when certifi imports, else botocore's own), found
    without importing either. urllib3 loads only that file, so SSL_CERT_FILE / SSL_CERT_DIR play no part.
    """
    if "AWS_CA_BUNDLE" in environ or "REQUESTS_CA_BUNDLE" in environ:
        value = _raw(environ, "AWS_CA_BUNDLE") or _raw(environ, "REQUESTS_CA_BUNDLE")
        if value is None or value == _PADDED:
            return None  # empty or blank: botocore's InvalidConfigError, or its own reading of it
        return os.path.expanduser(value)  # as urllib3 expands its ca_certs
    from importlib.util import find_spec

    for package in ("certifi", "botocore"):
        try:
            spec = find_spec(package)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        bundle = os.path.join(next(iter(spec.submodule_search_locations)), "cacert.pem")
        if os.path.isfile(bundle):
            return bundle
        return None  # a package botocore would import but whose file we cannot see (a zip): botocore decides
    return None


_HOST_NAME = re.compile(r"((?!-)[A-Za-z0-9-]{1,63}(?<!-)\.)*((?!-)[A-Za-z0-9-]{1,63}(?<!-))")


def _plain_url(url: str) -> str | None:
    """`scheme://host[:port]` for an http(s) URL without path, query, user or IPv6 literal; else None."""
    from urllib.parse import urlsplit

    if any(c in url for c in "\t\r\n"):  # urlsplit drops them; botocore refuses the URL
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    if parts.query or parts.fragment or "@" in parts.netloc or "[" in parts.netloc:
        return None
    host = parts.hostname
    # botocore.utils.is_valid_endpoint_url's host names, in ASCII only (its pattern also lets some non-ASCII
    # letters and digits through), without its trailing dot: anything else is botocore's to refuse or to send.
    if len(host) > 255 or not host.isascii() or not _HOST_NAME.fullmatch(host):
        return None
    return f"{parts.scheme}://{host}" + ("" if port is None else f":{port}")


class SendError(Exception):
    """A request that got no answer; `code` is the botocore exception name the lean transport would give.

    `sent` is True when the request may have reached the server (and so may have been applied): every code but
    those that say it never left, and always after it went out once on a kept-alive connection found dead."""

    def __init__(self, code: str, message: str, sent: bool | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.sent = code not in _NOT_SENT if sent is None else sent


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes


class Budget:
    """What one call may still spend: the end of the current attempt (None: no deadline, the configured
    timeouts alone) and whether its one free re-send on a new connection is still unused."""

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


class _Stale(Exception):
    """The connection was closed before any byte of the answer: the server dropped it while idle."""


# What a peer's close looks like on send or before the status line.
_CLOSED = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_MAX_LINE = 65536
_MAX_HEADERS = 200
_RECV = 65536


class _Connection:
    """One HTTP/1.1 connection: a socket (TLS-wrapped for https) and our own read buffer over it, so that what
    is left in the buffer after an answer can be seen (a file object's buffer hides it)."""

    __slots__ = ("buf", "end", "read_timeout", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.end: float | None = None  # when the attempt reading from it ends: each recv gets only what is left
        self.read_timeout: float | None = None  # the most any one recv waits (IDEMPOTENCY_READ_TIMEOUT)

    def _fill(self) -> bool:
        # Every recv waits at most the read timeout, and never past the attempt's end: a stalled connection
        # (half-open, an answer that stops after its first byte) is dropped after the read timeout and the
        # next attempt takes a fresh one, however much time the call has left. The end also bounds the sum,
        # so an answer trickled a byte at a time cannot hold the attempt past it.
        if self.end is not None:  # without an end, the socket keeps the read timeout _exchange gave it
            left = self.end - time.monotonic()
            if left <= 0:
                raise TimeoutError("the attempt's time ran out while reading")
            self.sock.settimeout(left if self.read_timeout is None else min(self.read_timeout, left))
        data = self.sock.recv(_RECV)
        if not data:
            return False
        self.buf += data
        return True

    def readline(self, limit: int) -> bytes:
        """One line with its end, at most `limit` bytes (longer: the first `limit`); at the close, what is left."""
        start = 0
        while True:
            end = self.buf.find(b"\n", start)
            if end >= 0 and end < limit:
                return self.take(end + 1)
            if len(self.buf) >= limit:
                return self.take(limit)
            start = len(self.buf)
            if not self._fill():
                return self.take(len(self.buf))

    def read(self, size: int) -> bytes:
        """`size` bytes, or fewer at the close."""
        while len(self.buf) < size and self._fill():
            pass
        return self.take(min(size, len(self.buf)))

    def read_to_close(self) -> bytes:
        while self._fill():
            pass
        return self.take(len(self.buf))

    def take(self, size: int) -> bytes:
        data = bytes(self.buf[:size])
        del self.buf[:size]
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def after_fork(owner: Any, forget: Any) -> None:
    """Call `forget(owner)` in a child process after a fork, for as long as `owner` lives."""
    import weakref

    ref = weakref.ref(owner)

    def in_child() -> None:
        alive = ref()
        if alive is not None:
            forget(alive)

    os.register_at_fork(after_in_child=in_child)


def tls_context(cafile: str | None) -> Any:
    """The TLS context botocore's lean path verifies with: `botocore.httpsession.create_urllib3_context`'s
    settings (not `ssl.create_default_context`, which on Python 3.13 adds VERIFY_X509_STRICT and
    VERIFY_X509_PARTIAL_CHAIN), then only `cafile`, as urllib3 loads `ca_certs`: SSL_CERT_FILE / SSL_CERT_DIR and
    the system's default paths are not consulted. The host name is checked by OpenSSL, as urllib3 2 has it."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.options |= ssl.OP_NO_SSLv2 | ssl.OP_NO_SSLv3 | ssl.OP_NO_COMPRESSION | ssl.OP_NO_TICKET
    if getattr(context, "post_handshake_auth", None) is not None:
        context.post_handshake_auth = True
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = True
    keylog = os.environ.get("SSLKEYLOGFILE")
    if keylog and not sys.flags.ignore_environment and hasattr(context, "keylog_filename"):
        context.keylog_filename = keylog
    if cafile is None:
        context.load_default_certs()
    else:
        context.load_verify_locations(cafile=cafile)
    return context


class Sender:
    """Kept-alive HTTP/1.1 connections to one endpoint, a lock-protected pool of up to 10 idle ones.

    A small HTTP/1.1 client on socket (and ssl for https, trusting the CA bundle botocore would: `cafile`)
    rather than http.client, whose email-package imports cost more init than everything else here. One request
    at a time per connection; Content-Length, chunked and to-the-close answers. A connection is kept only when
    its answer was read to its exact end, with nothing after it and nothing arriving while it sat idle, so an
    answer is always the one to the request just written.
    """

    def __init__(self, endpoint: str, connect_timeout: float, read_timeout: float, cafile: str | None = None) -> None:
        scheme, _, hostport = endpoint.partition("://")
        self._https = scheme == "https"
        host, _, port = hostport.partition(":")
        self._host = host
        self._port = int(port) if port else (443 if self._https else 80)
        self._url = endpoint + "/"
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._cafile = cafile
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._context: Any = None
        self.opened = 0  # connections opened, for tests
        self.resent = 0  # requests sent again on a new connection after a kept-alive one was found dead
        after_fork(self, Sender._forget)

    def _forget(self) -> None:
        # In a forked child: its idle connections are the parent's too, and the two would read each other's
        # answers. Its copies are closed (the parent's stay open) and it opens its own.
        self._lock = threading.Lock()  # another thread may have held it at the fork
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _tls(self) -> Any:
        import ssl  # only https endpoints pay for it

        if self._context is None:
            try:
                self._context = tls_context(self._cafile)
            except (OSError, ssl.SSLError) as error:
                # Loaded before any connection is made: nothing was sent.
                raise SendError(
                    "SSLError", f"SSL validation failed for {self._url}: cannot load the CA bundle {self._cafile}: "
                    f"{error}", sent=False
                ) from error
        return self._context

    def _new(self, budget: Budget) -> _Connection:
        context = self._tls() if self._https else None  # a bundle that cannot be loaded fails before connecting
        timeout = budget.cut(self._connect_timeout)
        if timeout <= 0:
            raise self._connect_timeout_error()
        try:
            sock = socket.create_connection((self._host, self._port), timeout=timeout)
        except TimeoutError as error:
            raise self._connect_timeout_error() from error
        except OSError as error:
            raise self._unreachable() from error
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if context is not None:
                import ssl

                # The handshake gets what the attempt has left after connecting, not the connect timeout again.
                left = budget.cut(self._connect_timeout)
                if left <= 0:
                    raise self._connect_timeout_error()
                sock.settimeout(left)
                try:
                    sock = context.wrap_socket(sock, server_hostname=self._host)
                except ssl.SSLError as error:  # the handshake failed: no byte of the request left
                    raise SendError(
                        "SSLError", f"SSL validation failed for {self._url} {error} (trusted: {self._trusted()})",
                        sent=False,
                    ) from error
                except TimeoutError as error:
                    raise self._connect_timeout_error() from error
                except OSError as error:
                    raise self._unreachable() from error
        except BaseException:
            sock.close()
            raise
        self.opened += 1
        return _Connection(sock)

    def _connect_timeout_error(self) -> SendError:
        return SendError("ConnectTimeoutError", f'Connect timeout on endpoint URL: "{self._url}"')

    def _unreachable(self) -> SendError:
        return SendError("EndpointConnectionError", f'Could not connect to the endpoint URL: "{self._url}"')

    def _trusted(self) -> str:
        return f"the CA bundle {self._cafile}, as botocore resolves it (AWS_CA_BUNDLE, REQUESTS_CA_BUNDLE, certifi)"

    def _take(self) -> _Connection | None:
        """An idle connection still fit to use, or None; idle ones the server closed are dropped here."""
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None or _alive(connection):
                return connection
            connection.close()

    def _give(self, connection: _Connection) -> None:
        with self._lock:
            if len(self._idle) < _MAX_IDLE:
                self._idle.append(connection)
                return
        connection.close()

    def send(self, headers: dict[str, str], body: bytes, budget: Budget | None = None) -> Answer:
        """POST `body` with `headers` and read its answer, within `budget` (None: the configured timeouts)."""
        if budget is None:
            budget = Budget()
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        message = f"POST / HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body
        connection = self._take()
        if connection is None:
            try:
                return self._exchange(self._new(budget), message, budget)
            except _Stale:
                raise self._closed() from None
        try:
            return self._exchange(connection, message, budget)
        except _Stale:
            # A kept-alive connection the server had closed while it sat idle (a long freeze between
            # invocations) failed before any byte of an answer. It is sent once more on a new connection, which
            # is not a retry attempt: at most once per call (the budget's one re-send), within its time.
            if not budget.resend or budget.cut(self._connect_timeout) <= 0:
                raise self._closed() from None
            budget.resend = False
        self.resent += 1
        try:
            return self._exchange(self._new(budget), message, budget)
        except _Stale:
            raise self._closed() from None
        except SendError as error:
            # The request went out on the dead connection first: a server may have read it before closing.
            error.sent = True
            raise

    def _closed(self) -> SendError:
        return SendError(
            "ConnectionClosedError",
            f'Connection was closed before we received a valid response from endpoint URL: "{self._url}".',
        )

    def _read_timeout_error(self, sent: bool | None = None) -> SendError:
        return SendError("ReadTimeoutError", f'Read timeout on endpoint URL: "{self._url}"', sent)

    def _exchange(self, connection: _Connection, message: bytes, budget: Budget) -> Answer:
        try:
            timeout = budget.cut(self._read_timeout)
            if timeout <= 0:  # the attempt's time went on connecting: nothing was sent
                raise self._read_timeout_error(sent=False)
            connection.sock.settimeout(timeout)
            connection.end = budget.end
            connection.read_timeout = self._read_timeout
            early = False
            try:
                connection.sock.sendall(message)
            except OSError as error:
                if not (isinstance(error, _CLOSED) or _is_ssl_eof(error)):
                    raise
                # The server may have answered before reading the whole request (a 400 for a body too large)
                # and closed: that answer is read below, as urllib3 reads it, and the connection not kept. Over
                # TLS the close shows as an SSL EOF rather than a reset.
                early = True
            try:
                line = connection.readline(_MAX_LINE + 1)
            except _CLOSED as error:
                if connection.buf:  # part of an answer came before the reset: the request was read, not stale
                    raise
                raise _Stale() from error
            if not line:
                raise _Stale()
            status, headers, data, keep = _read_answer(connection, line)
            if early or connection.buf:
                keep = False  # bytes after the answer, or a request not wholly sent: out of step, never reused
        except _Stale:
            connection.close()
            raise
        except TimeoutError as error:
            connection.close()
            raise self._read_timeout_error() from error
        except SendError:
            connection.close()
            raise
        except (OSError, ValueError) as error:
            connection.close()
            if _is_ssl_error(error):
                raise SendError("SSLError", f"SSL error for {self._url} {error}") from error
            if isinstance(error, (ConnectionError, _Malformed)):
                raise self._closed() from error
            raise SendError("HTTPClientError", f"An HTTP Client raised an unhandled exception: {error}") from error
        if keep:
            self._give(connection)
        else:
            connection.close()
        return Answer(status, headers, data)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


class _Malformed(ValueError):
    """An answer that is not HTTP/1.x as we read it, or cut short."""


def _read_answer(reader: _Connection, line: bytes) -> tuple[int, dict[str, str], bytes, bool]:
    """(status, lower-cased headers, body, keep the connection) of the answer whose status line is `line`."""
    while True:
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(line) > _MAX_LINE:
            raise _Malformed(f"bad status line {line[:80]!r}")
        # As http.client: exactly three digits, 100 to 999 (a status of 0 or 99 is no answer, not a success).
        code = parts[1]
        if len(code) != 3 or not code.isdigit() or code[:1] == b"0":
            raise _Malformed(f"bad status line {line[:80]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        last = None
        for _ in range(_MAX_HEADERS + 1):
            raw = reader.readline(_MAX_LINE + 1)
            if raw in (b"\r\n", b"\n"):
                break
            if not raw or len(raw) > _MAX_LINE:
                raise _Malformed("headers cut short")
            text = raw.decode("latin-1")
            if text[:1] in (" ", "\t"):  # obs-fold: the previous header's value goes on
                if last is None:
                    raise _Malformed("bad header line")
                headers[last] = f"{headers[last]} {text.strip()}".strip()
                continue
            name, colon, value = text.partition(":")
            if not colon:
                raise _Malformed("bad header line")
            name = name.strip().lower()
            value = value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
            last = name
        else:
            raise _Malformed("too many headers")
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            line = reader.readline(_MAX_LINE + 1)
            continue
        break
    keep = parts[0] == b"HTTP/1.1"
    connection = headers.get("connection", "").lower()
    if "close" in connection:
        keep = False
    elif "keep-alive" in connection:
        keep = True
    if status in (204, 304):
        return status, headers, b"", keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, headers, _read_chunked(reader), keep
    length = headers.get("content-length")
    if length is None:
        return status, headers, reader.read_to_close(), False  # to the end of the connection
    # Repeated (joined above) it must be one value repeated, as RFC 9112 allows; different ones are ambiguous.
    values = {value.strip() for value in length.split(",")}
    if len(values) != 1:
        raise _Malformed("conflicting Content-Length")
    try:
        size = int(values.pop())
    except ValueError:
        raise _Malformed("bad Content-Length") from None
    if size < 0:
        raise _Malformed("bad Content-Length")
    data = reader.read(size)
    if len(data) != size:
        raise _Malformed(f"body cut short: {len(data)} of {size} bytes")
    return status, headers, data, keep


def _read_chunked(reader: _Connection) -> bytes:
    chunks = []
    while True:
        line = reader.readline(_MAX_LINE + 1)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _Malformed("bad chunk size") from None
        if size < 0:
            raise _Malformed("bad chunk size")
        if size == 0:
            while True:  # trailers, to the blank line that ends the answer
                trailer = reader.readline(_MAX_LINE + 1)
                if trailer in (b"\r\n", b"\n"):
                    return b"".join(chunks)
                if not trailer:  # closed after the last chunk: the body is whole, as http.client takes it
                    return b"".join(chunks)
                if not trailer.endswith(b"\n"):
                    raise _Malformed("chunked answer cut short")
        data = reader.read(size)
        if len(data) != size or reader.read(2) != b"\r\n":
            raise _Malformed("chunk cut short")
        chunks.append(data)


def _is_ssl_error(error: BaseException) -> bool:
    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(error, ssl.SSLError)


def _is_ssl_eof(error: BaseException) -> bool:
    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(error, (ssl.SSLEOFError, ssl.SSLZeroReturnError))


def _alive(connection: _Connection) -> bool:
    # An idle connection with anything to read (in our buffer or on the socket) has been closed (EOF) or is
    # out of step: either way unusable.
    if connection.buf:
        return False
    try:
        # poll, not select: select refuses descriptors past FD_SETSIZE (1024), which a process holding many
        # files reaches, and every idle connection would then look dead.
        poller = select.poll()
        poller.register(connection.sock, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


# -- retries: botocore's standard mode (botocore.retries.standard, .quota, .special) -------------------------

_TRANSIENT_CODES = frozenset(("RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete"))
_TRANSIENT_STATUSES = frozenset((500, 502, 503, 504))
_THROTTLE_CODES = frozenset(
    (
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    )
)
# Each operation's modeled errors (a 429 is a throttle only when its code is not one of them) and the one
# marked retryable (not as a throttle). tests/unit/test_transport.py checks these against botocore's model.
_COMMON_ERRORS = frozenset(
    (
        "ProvisionedThroughputExceededException",
        "ResourceNotFoundException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ThrottlingException",
    )
)
_WRITE_ERRORS = _COMMON_ERRORS | {
    CHECK_FAILED,
    "ItemCollectionSizeLimitExceededException",
    "TransactionConflictException",
    "ReplicatedWriteConflictException",
}
MODELED_ERRORS = {
    "PutItem": _WRITE_ERRORS,
    "UpdateItem": _WRITE_ERRORS,
    "DeleteItem": _WRITE_ERRORS,
    "GetItem": _COMMON_ERRORS,
}
_CONFLICT = frozenset(("ReplicatedWriteConflictException",))
RETRYABLE_MODELED = {"PutItem": _CONFLICT, "UpdateItem": _CONFLICT, "DeleteItem": _CONFLICT}
_EMPTY: frozenset[str] = frozenset()

_QUOTA_CAPACITY = 500
_RETRY_COST = 14
_THROTTLING_RETRY_COST = 5
_NO_RETRY_INCREMENT = 1
_THROTTLING_BASE = 1.0
_TRANSIENT_BASE = 0.025  # DynamoDB's
_MAX_BACKOFF = 20.0
_RETRY_AFTER_MAX_ADDITIONAL = 5.0


class Retry:
    """The standard retry mode's decision, backoff and retry quota, for one transport (the quota is shared)."""

    def __init__(self, max_attempts: int, random: Any = _random.random) -> None:
        self.max_attempts = max_attempts
        self._random = random
        self._lock = threading.Lock()
        self.capacity = _QUOTA_CAPACITY

    def delay(
        self,
        operation: str,
        attempt: int,
        *,
        status: int | None = None,
        code: str | None = None,
        headers: Any = None,
        failed_send: bool = False,
        crc_mismatch: bool = False,
    ) -> tuple[float, int] | None:
        """(seconds to wait, quota taken) before the next attempt, or None: give up.

        `code` is the parsed error code (None without a parsed error: a failed send, a damaged body).
        """
        if attempt >= self.max_attempts:
            return None
        modeled = MODELED_ERRORS.get(operation, _EMPTY)
        retryable_modeled = code is not None and code in RETRYABLE_MODELED.get(operation, _EMPTY)
        throttle_status = status == 429 and not (code is not None and code in modeled)
        throttle_code = code in _THROTTLE_CODES
        if not (
            code in _TRANSIENT_CODES
            or status in _TRANSIENT_STATUSES
            or failed_send
            or throttle_code
            or throttle_status
            or retryable_modeled
            or crc_mismatch
        ):
            return None
        # The one modeled retryable error is transient, so a throttle is a code or a bare 429.
        throttling = throttle_code or (not retryable_modeled and throttle_status)
        cost = _THROTTLING_RETRY_COST if throttling else _RETRY_COST
        with self._lock:
            if cost > self.capacity:
                return None
            self.capacity -= cost
        base = _THROTTLING_BASE if throttling else _TRANSIENT_BASE
        wait = self._random() * min(base * 2 ** (attempt - 1), _MAX_BACKOFF)
        after = _retry_after(headers)
        if after is not None:
            wait = max(wait, min(after, _RETRY_AFTER_MAX_ADDITIONAL + wait))
        return wait, cost

    def succeeded(self, taken: int) -> None:
        """A 2xx answer: give back the last retry's quota, or one unit when the call needed no retry."""
        amount = taken or _NO_RETRY_INCREMENT
        with self._lock:
            self.capacity = min(_QUOTA_CAPACITY, self.capacity + amount)


def _retry_after(headers: Any) -> float | None:
    if headers is None:
        return None
    value = headers.get("x-amz-retry-after")
    if value is None:
        return None
    try:
        seconds = int(value) / 1000.0
    except (ValueError, OverflowError):
        return None
    return None if seconds < 0 else seconds


# -- errors --------------------------------------------------------------------------------------------------


def parse_error(status: int, body: bytes) -> tuple[str, str]:
    """(code, message) of a non-2xx answer, as botocore's JSON parser gives them.

    `__type` without its `com.amazonaws.dynamodb.v20120810#` prefix, `message` or `Message`; an empty or HTML
    5xx body (a load balancer's) gives the status as code and its reason as message.
    """
    stripped = body.strip()
    if status >= 500 and (not stripped or stripped.startswith(b"<html>")):
        from http import HTTPStatus  # only for such answers

        try:
            return str(status), HTTPStatus(status).phrase
        except ValueError:
            return str(status), ""
    parsed: Any = {}
    if body:
        text = body.decode("utf-8", "replace")
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:  # botocore takes the body as the message; it may hold a stored result
            parsed = {"message": unreadable(body)}
        if not isinstance(parsed, dict):
            parsed = {}
    message = parsed.get("message", parsed.get("Message", ""))
    code = parsed.get("__type", str(status))
    if not isinstance(code, str):
        code = str(status)
    if ":" in code:
        code = code.split(":", 1)[0]
    if "#" in code:
        code = code.rsplit("#", 1)[1]
    return code, message if isinstance(message, str) else str(message)


# -- the transport -------------------------------------------------------------------------------------------


class FastTransport:
    """DynamoDB JSON 1.0 signed by `sigv4`, over `Sender`, retried by `Retry`; no botocore."""

    def __init__(
        self,
        plan: Plan,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_attempts: int,
        sleep: Any = time.sleep,
        random: Any = _random.random,
    ) -> None:
        self.region = plan.region
        self.endpoint = plan.endpoint
        self._signer = Signer(plan.access_key, plan.secret_key, plan.token, plan.region, _SERVICE)
        self._host = plan.endpoint.partition("://")[2]
        if plan.endpoint.startswith("https://") and self._host.endswith(":443"):
            self._host = self._host[:-4]  # as botocore signs it: no default port
        elif plan.endpoint.startswith("http://") and self._host.endswith(":80"):
            self._host = self._host[:-3]
        self._http = Sender(plan.endpoint, connect_timeout, read_timeout, plan.cafile)
        self.retry = Retry(max_attempts, random)
        self._sleep = sleep
        self._user_agent = "idempotency-layer md/transport#fast"

    def call(self, operation: str, params: dict, deadline: float | None = None) -> dict:
        """One request, retried as botocore's standard mode. With `deadline` (`time.monotonic()`), as the lean
        pool: an attempt starting now gets what `_time_left` gives (every attempt, its re-send on a new connection
        included, ends by `deadline + LAST_CHANCE_S`), its connect and read timeouts cut to that, and no backoff
        that would end past the deadline is waited out. A failure says whether the request may have been applied
        (`DynamoDBError.uncertain`), over all the call's attempts, as the lean pool says it."""
        body = encode_body(params)
        base = {
            "Content-Type": _CONTENT_TYPE,
            "Host": self._host,
            "X-Amz-Target": _TARGET_PREFIX + operation,
        }
        budget = Budget()  # one per call: its one free re-send after a dead kept-alive connection
        attempt = 1
        taken = 0
        uncertain = False  # an attempt of this call may have been applied
        while True:
            if deadline is not None:
                left = _time_left(deadline)
                if left is None:  # the backoff overslept the deadline
                    raise _out_of_time(operation, uncertain)
                budget.attempt(left)
            # Signed per attempt: a fresh X-Amz-Date.
            headers = self._signer.sign(base, body)
            headers["User-Agent"] = self._user_agent
            headers["Accept-Encoding"] = "identity"  # as http.client adds it on botocore's path: no compressed answer
            status: int | None = None
            code: str | None = None
            answer_headers = None
            crc_bad = False
            try:
                answer = self._http.send(headers, body, budget)
            except SendError as error:
                failure = DynamoDBError(operation, error.code, str(error))
                failed_send = True
                uncertain = uncertain or error.sent
            else:
                failed_send = False
                status, answer_headers, content = answer
                if not crc32_ok(answer_headers, content):
                    crc_bad = True  # damaged on the way: nothing in the body can be trusted
                    uncertain = True
                    failure = DynamoDBError(
                        operation,
                        "ChecksumError",
                        f"Checksum crc32 failed, expected checksum {answer_headers.get('x-amz-crc32')} did not "
                        f"match calculated checksum: {zlib.crc32(content)}",
                        None,
                        status,
                    )
                elif status < 300:
                    self.retry.succeeded(taken)
                    return decode_answer(operation, status, content)
                else:
                    code, message = parse_error(status, content)
                    failure = DynamoDBError(operation, code, message, condition_item(code, content), status)
                    # A 5xx says nothing of whether it was applied, nor does an answer that is not DynamoDB's
                    # JSON (a 400 cut short may have answered a claim that landed).
                    # A failed condition's code came from the JSON object's __type: checked no further (a replay's
                    # answer carries the whole record).
                    damaged = code != CHECK_FAILED and unreadable_error(status, content)
                    uncertain = uncertain or status >= 500 or damaged
            decision = self.retry.delay(
                operation,
                attempt,
                status=status,
                code=code,
                headers=answer_headers,
                failed_send=failed_send,
                crc_mismatch=crc_bad,
            )
            if decision is None or (deadline is not None and time.monotonic() + decision[0] >= deadline):
                failure.uncertain = uncertain
                raise failure
            wait, taken = decision
            self._sleep(wait)
            attempt += 1
