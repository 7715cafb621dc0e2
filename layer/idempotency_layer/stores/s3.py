"""Large results in S3 (IDEMPOTENCY_LARGE_RESULTS_BUCKET): one object per result, its key derived from the record
key and the owner token, written before the completion; the completion stores where it is, its size and SHA-256.

    put(key, owner, data)  -> PUT  <prefix><record key>/<owner>   (SSE-S3; S3 checks x-amz-content-sha256)
    get(pointer)           -> GET from the pointer's bucket (the setting's, or one on the read allow-list), at most
                              its size read, then size and SHA-256 checked: a missing or different object is an
                              error
    delete(object_key)     -> DELETE (purge, on `where(pointer)`; doctor's probe)

A record holds a result in the bucket as `stored(pointer, format)`: the format `codec.STORED + format`, the pointer
as JSON text. Only this module writes and reads that text (`Pointer.text`, `pointer`), and `fetch` is the one way
back from it to the result, for replays (`keeping.Keeper.decode`) and the CLI's `show --result` alike. A pointer is
followed only where `confinement` finds nothing wrong (its bucket, its key, its size), even without a record MAC:
a forged record cannot make the function read another bucket or object with its own credentials.

The layer above asks a bucket, never this module, and never sees S3's types or errors: `keep` (the pointer to
complete with), `fetch` (a replay's result, S3's failure said as the layer's store error), `located`, `look` and
`discard` (the CLI's show and purge). Where IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set, `UNSET` answers the same
questions: it reads a record's pointer and says the setting is missing.

Requests are signed by the layer's own SigV4 (`aws.sigv4.Signer`, service `s3`, as botocore's S3SigV4Auth
signs them: tests/unit/test_s3.py) and sent with `http.client`, one connection per request: a large result is
rare, and a kept-alive pool would cost every invocation its bookkeeping. The deadline rule is the DynamoDB
client's (`Deadline.attempt_time`); a request that fails without an answer is retried once if the deadline allows
(PUT and DELETE of one key are idempotent). Addressing: `https://<bucket>.s3.<region>.amazonaws.com/<key>`, or
path style on AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (a local S3).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import namedtuple
from urllib.parse import quote, urlsplit

from ..errors import IdempotencyPersistenceLayerError

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, NamedTuple

    from .. import codec
    from ..deadline import Deadline

    class _PointerFields(NamedTuple):
        object_key: str
        size: int
        sha256: str  # hex
        bucket: str | None = None  # None: a pointer that names no bucket (the setting's bucket)
else:
    _PointerFields = namedtuple("Pointer", ("object_key", "size", "sha256", "bucket"), defaults=(None,))


class Pointer(_PointerFields):
    """Where a result is, and what it must be."""
    __slots__ = ()

    def text(self) -> str:
        """The pointer as a record stores it."""
        import orjson

        return orjson.dumps({"bucket": self.bucket, "key": self.object_key, "size": self.size,
                             "sha256": self.sha256}).decode()

    @classmethod
    def read(cls, data: str | bytes | None) -> Pointer:
        """The pointer a record stores; `S3Error` (code `Malformed`) for anything this layer does not write: its
        bucket a name S3 may have (no path, no host), its key 1 to 1024 characters, its size a count, its digest
        64 hex digits. A pointer that names no bucket stands for the setting's bucket."""
        import orjson

        try:
            found = orjson.loads(data or b"")
        except orjson.JSONDecodeError:
            found = None
        if isinstance(found, dict):
            key, size, digest, bucket = (found.get(name) for name in ("key", "size", "sha256", "bucket"))
            if (isinstance(key, str) and 0 < len(key) <= 1024 and type(size) is int and size >= 0
                    and isinstance(digest, str) and _SHA256.fullmatch(digest)
                    and (bucket in (None, "") or (isinstance(bucket, str) and _bucket_name(bucket)))):
                return cls(key, size, digest, bucket or None)
        raise S3Error("the record points to a stored result in a form this layer does not write", code="Malformed")


def _bucket_name(name: str) -> bool:
    from ..store_settings import BUCKET  # the setting's own rule: the layer writes no other bucket into a pointer

    return BUCKET.fullmatch(name) is not None


_SHA256 = re.compile(r"[0-9a-f]{64}")
_OWNER = re.compile(r"[0-9a-f]{32}")  # the claim's owner token (cycle: 16 random bytes, hex)
# The largest object a pointer may name: Lambda's 6 MB synchronous response, and a margin for the encoding (a
# result is stored encoded, at most as large as the response). Larger is refused before any request.
MAX_OBJECT_BYTES = 8 * 1024 * 1024


def confinement(pointer: Pointer, key: str, *, bucket: str, prefix: str, legacy_prefix: str | None = None,
                read_buckets: tuple[str, ...] = ()) -> str | None:
    """What is wrong with following `pointer` for the record of `key`, or None: it must name `bucket` (or no
    bucket) or one of `read_buckets`, the object `<prefix><key>/<32 lowercase hex>` (or the same under
    `legacy_prefix`), and a size of at most MAX_OBJECT_BYTES. The problem is said without the pointer's key."""
    if pointer.size > MAX_OBJECT_BYTES:
        return (f"its size ({pointer.size} bytes) is over the {MAX_OBJECT_BYTES} bytes a stored result may have "
                "(Lambda's 6 MB response and a margin)")
    named = pointer.bucket or bucket
    if named != bucket and named not in read_buckets:
        return (f"it names the bucket {named!r}, which is neither IDEMPOTENCY_LARGE_RESULTS_BUCKET ({bucket!r}) nor "
                "on IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS")
    for base in (prefix,) if legacy_prefix is None else (prefix, legacy_prefix):
        start = f"{base}{key}/"
        if pointer.object_key.startswith(start) and _OWNER.fullmatch(pointer.object_key[len(start):]):
            return None
    return (f"its object key is not the one this layer writes for the record, {prefix}{key}/<owner: 32 hex> "
            "(IDEMPOTENCY_LARGE_RESULTS_PREFIX, the record key, the owner)")


def stored(pointer: Pointer, form: str) -> codec.Encoded:
    """What a record holds for a result of format `form` kept at `pointer`."""
    from .. import codec

    return codec.Encoded(codec.STORED + form, pointer.text())


def pointer(result: codec.Encoded) -> tuple[Pointer, str]:
    """The pointer a record's `stored` result holds, and the format of what it points to; `S3Error` (code
    `Malformed`) for one this layer does not write."""
    from .. import codec

    return Pointer.read(result.data), result.format[len(codec.STORED):]


def fetch(bucket: Bucket | None, key: str, result: codec.Encoded, deadline: Deadline | None = None
          ) -> codec.Encoded:
    """The result the `stored` pointer of the record of `key` stands for, read from the bucket the pointer names
    and checked by size and SHA-256: what a replay decodes. `bucket`: the setting's (None when
    IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set). `S3Error` when it cannot be: code `Malformed`, `Confined` (a
    pointer `confinement` refuses: no request is made), `NoBucket`, `Missing`, `Different`, S3's own code
    (`AccessDenied`, `NoSuchBucket`), or None (no answer); its message names the object, never its content."""
    from .. import codec

    found, form = pointer(result)
    if bucket is None:
        where = f"s3://{found.bucket}/{found.object_key}" if found.bucket else found.object_key
        raise S3Error(f"the stored result is in {where}, but IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set here",
                      code="NoBucket")
    problem = bucket.confinement(found, key)
    if problem is not None:
        raise S3Error(f"the record's pointer to its stored result is not followed: {problem}", code="Confined")
    return codec.Encoded(form, bucket.get(found, deadline))


def _replay_error(key: str, error: S3Error) -> IdempotencyPersistenceLayerError:
    """A replay's failure to read `key`'s result from the bucket, as the layer says it."""
    if error.code == "Malformed":
        return IdempotencyPersistenceLayerError(f"the record of key {key!r} points to a stored result in a form this "
                                                "layer cannot read; the handler did not run", permanent=True)
    if error.code == "Confined":
        return IdempotencyPersistenceLayerError(f"key {key!r}: {error}; the handler did not run", permanent=True)
    if error.code == "NoBucket":
        return IdempotencyPersistenceLayerError(
            f"key {key!r} already ran and its result is in the large-results bucket, but "
            "IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set here; the handler did not run", permanent=True)
    return IdempotencyPersistenceLayerError(
        f"the stored result of key {key!r} could not be read from the large-results bucket: {error}; the handler "
        "did not run", permanent=error.code in ("Missing", "Different"), uncertain=error.uncertain)


def _located(result: codec.Encoded) -> Pointer | None:
    try:
        return pointer(result)[0]
    except S3Error:
        return None


def _look(bucket: Bucket | None, key: str, result: codec.Encoded) -> codec.Encoded | tuple[str, str]:
    try:
        return fetch(bucket, key, result)
    except S3Error as error:
        return str(error), error.code or "NoAnswer"


class Unset:
    """The large-results bucket where IDEMPOTENCY_LARGE_RESULTS_BUCKET is not set (`UNSET`): it reads a record's
    pointer, and says the setting is missing when asked for what it points to."""

    __slots__ = ()

    def fetch(self, key: str, result: codec.Encoded, deadline: Deadline | None = None) -> codec.Encoded:
        """As `Bucket.fetch`: the layer's store error (no bucket here, or a pointer this layer does not write)."""
        try:
            return fetch(None, key, result, deadline)
        except S3Error as error:
            raise _replay_error(key, error) from None

    def located(self, result: codec.Encoded) -> Pointer | None:
        return _located(result)

    def look(self, key: str, result: codec.Encoded) -> codec.Encoded | tuple[str, str]:
        return _look(None, key, result)


UNSET = Unset()


class S3Error(Exception):
    """A request failed. `code`: S3's error code, `Missing`/`Different` for an object that is not the one written,
    or None for no answer. `uncertain`: it may have been applied."""

    def __init__(self, message: str, *, code: str | None = None, uncertain: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.uncertain = uncertain


_ATTEMPTS = 2


class Bucket:
    def __init__(self, name: str, prefix: str, *, region: str, credentials: tuple[str, str, str | None],
                 connect_timeout: float, read_timeout: float, endpoint: str | None = None,
                 cafile: str | None = None, read_buckets: tuple[str, ...] = (),
                 legacy_prefix: str | None = None) -> None:
        from ..aws.sigv4 import Signer

        self.name = name
        self.prefix = prefix
        # The buckets besides this one whose objects a pointer may name (IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS).
        self.read_buckets = read_buckets
        # With the default prefix, the one objects had before it became per function: read for records completed
        # before the upgrade (`<legacy><record key>/<owner>`), never written.
        self.legacy_prefix = legacy_prefix
        self.timeouts = (connect_timeout, read_timeout)
        self.cafile = cafile
        self._signer = Signer(*credentials, region, "s3")
        self.root = ""  # an endpoint's own path, which botocore sends before the bucket's (path style)
        if endpoint:
            parts = urlsplit(endpoint)
            if parts.query or parts.fragment or parts.username is not None or parts.password is not None:
                raise ValueError("the S3 endpoint URL (AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL) must be "
                                 "scheme://host[:port][/path]: it holds a user, a query or a fragment")
            self.root = _endpoint_root(parts.path)
            self.scheme, self.host, self.base = parts.scheme, parts.netloc, f"{self.root}/{quote(name)}"
        else:
            self.scheme, self.host, self.base = "https", f"{name}.s3.{region}.amazonaws.com", ""
        self._context: Any = None

    def named(self, name: str) -> Bucket:
        """This bucket's client for another bucket (a pointer written before the setting changed); `S3Error`
        (code `Confined`) for a name that is no bucket name the setting could have."""
        if name == self.name:
            return self
        from ..store_settings import reachable_bucket

        if not reachable_bucket(name):
            raise S3Error("the pointer names no S3 bucket this layer can reach", code="Confined")
        other = Bucket.__new__(Bucket)
        other.__dict__.update(self.__dict__)
        other.name = name
        if self.base:
            other.base = f"{self.root}/{quote(name)}"
        else:
            other.host = self.host.replace(f"{self.name}.s3.", f"{name}.s3.", 1)
        return other

    def where(self, pointer: Pointer) -> Bucket:
        """The client of the bucket `pointer` names, this one or one on the read allow-list: where a replay reads it
        and purge deletes it; `S3Error` (code `Confined`) for any other."""
        name = pointer.bucket or self.name
        if name != self.name and name not in self.read_buckets:
            raise S3Error(f"the pointer names the bucket {name!r}, which is neither IDEMPOTENCY_LARGE_RESULTS_BUCKET "
                          "nor on IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS", code="Confined")
        return self.named(name)

    def confinement(self, pointer: Pointer, key: str) -> str | None:
        """What is wrong with following `pointer` for the record of `key` (module `confinement`), or None."""
        return confinement(pointer, key, bucket=self.name, prefix=self.prefix, legacy_prefix=self.legacy_prefix,
                           read_buckets=self.read_buckets)

    def object_key(self, key: str, owner: str) -> str:
        return f"{self.prefix}{key}/{owner}"

    def object_keys(self, key: str, owner: str) -> tuple[str, ...]:
        """The keys the object of the record of `key` that `owner` completed may have: `object_key`, and with the
        default prefix the one written before it became per function."""
        own = self.object_key(key, owner)
        if self.legacy_prefix is None or self.legacy_prefix == self.prefix:
            return (own,)
        return own, f"{self.legacy_prefix}{key}/{owner}"

    def owns(self, pointer: Pointer, key: str, owner: str | None) -> bool:
        """Whether `pointer` names the object the layer writes for the record of `key` that `owner` completed
        (`<prefix><key>/<owner>`, or its legacy form; in whichever bucket): all that purge deletes."""
        return owner is not None and pointer.object_key in self.object_keys(key, owner)

    # -- the three requests -----------------------------------------------------------------------------

    def put(self, key: str, owner: str, data: bytes, deadline: Deadline | None = None) -> Pointer:
        return self.write(self.object_key(key, owner), data, deadline)

    def write(self, object_key: str, data: bytes, deadline: Deadline | None = None) -> Pointer:
        """`data` as the object `object_key` (a record's result by `put`; doctor's probe). One larger than
        MAX_OBJECT_BYTES is not written (a replay would refuse its pointer): `S3Error`, no request."""
        if len(data) > MAX_OBJECT_BYTES:
            raise S3Error(f"the result ({len(data)} bytes) is over the {MAX_OBJECT_BYTES} bytes a stored result may "
                          "have; not written")
        digest = hashlib.sha256(data).hexdigest()
        self._request("PUT", object_key, data, deadline, {"x-amz-server-side-encryption": "AES256"}, digest)
        return Pointer(object_key, len(data), digest, self.name)

    def get(self, pointer: Pointer, deadline: Deadline | None = None) -> bytes:
        """The object `pointer` names, from the bucket it names (`where`), checked by size and SHA-256: one over
        MAX_OBJECT_BYTES is refused before any request, an answer whose Content-Length is not the size before its
        body is read, and no more than size + 1 bytes of a body are read."""
        if pointer.size > MAX_OBJECT_BYTES:
            raise S3Error(f"the pointer's size ({pointer.size} bytes) is over the {MAX_OBJECT_BYTES} bytes a stored "
                          "result may have", code="Confined")
        bucket = self.where(pointer)
        if bucket is not self:
            return bucket.get(pointer, deadline)
        status, body = self._request("GET", pointer.object_key, b"", deadline, expect=pointer.size)
        if status == _LENGTH_DIFFERS:
            raise S3Error(f"the stored result s3://{self.name}/{pointer.object_key} is not the one written (S3 "
                          f"announced another length than the {pointer.size} bytes expected)", code="Different")
        if status == 404:
            raise S3Error(f"the stored result s3://{self.name}/{pointer.object_key} is missing", code="Missing")
        if len(body) != pointer.size or hashlib.sha256(body).hexdigest() != pointer.sha256:
            raise S3Error(f"the stored result s3://{self.name}/{pointer.object_key} is not the one written "
                          f"({len(body)} bytes, {pointer.size} expected, or another SHA-256)", code="Different")
        return body

    def delete(self, object_key: str, deadline: Deadline | None = None) -> None:
        self._request("DELETE", object_key, b"", deadline)

    # -- what the layer above asks (keeping.Keeper, the CLI's show and purge), S3's failures in its words ------------

    def keep(self, key: str, owner: str, result: codec.Oversized, deadline: Deadline | None = None) -> codec.Encoded:
        """`result` written for the record of `key` that `owner` claimed: the pointer to complete the record with.
        The layer's store error, in S3's words, when it was not written."""
        try:
            found = self.put(key, owner, result.packed, deadline)
        except S3Error as error:
            raise IdempotencyPersistenceLayerError(str(error), uncertain=error.uncertain) from None
        return stored(found, result.inner)

    def fetch(self, key: str, result: codec.Encoded, deadline: Deadline | None = None) -> codec.Encoded:
        """The result the record of `key` points to, read where the pointer says and checked (`fetch`); the layer's
        store error, as a replay says it, when it cannot be."""
        try:
            return fetch(self, key, result, deadline)
        except S3Error as error:
            raise _replay_error(key, error) from None

    def located(self, result: codec.Encoded) -> Pointer | None:
        """The pointer a record's stored result holds, or None for one this layer does not write."""
        return _located(result)

    def look(self, key: str, result: codec.Encoded) -> codec.Encoded | tuple[str, str]:
        """The result the pointer of the record of `key` stands for, read and checked as a replay reads it (a
        pointer `confinement` refuses is not followed); or why not: what S3 (or the check) said, and its code
        (`Malformed`, `Confined`, `Missing`, `Different`, S3's own, or `NoAnswer`)."""
        return _look(self, key, result)

    def discard(self, pointer: Pointer, deadline: Deadline | None = None) -> None:
        """Delete the object `pointer` names, in the bucket it names (`where`); the layer's store error, in S3's
        words, when it was not (`uncertain`: it may have been)."""
        try:
            self.where(pointer).delete(pointer.object_key, deadline)
        except S3Error as error:
            raise IdempotencyPersistenceLayerError(str(error), uncertain=error.uncertain) from None

    # -- plumbing -------------------------------------------------------------------------------------------

    def _connection(self, seconds: float) -> Any:
        import http.client

        if self.scheme == "http":
            return http.client.HTTPConnection(self.host, timeout=min(self.timeouts[0], seconds))
        if self._context is None:
            from ..aws.trust import tls_context

            self._context = tls_context(self.cafile)
        return http.client.HTTPSConnection(self.host, timeout=min(self.timeouts[0], seconds), context=self._context)

    def _request(self, method: str, object_key: str, body: bytes, deadline: Deadline | None,
                 extra: dict[str, str] | None = None, digest: str | None = None, *, expect: int | None = None
                 ) -> tuple[int, bytes]:
        """The answer's status and body (`expect`: the size a 2xx body must have; an answer announcing another
        Content-Length is `_LENGTH_DIFFERS`, its body unread, and at most `expect` + 1 bytes are read)."""
        path = f"{self.base}/{quote(object_key, safe='/-_.~')}"
        headers = {"Host": self.host, "x-amz-content-sha256": digest or hashlib.sha256(body).hexdigest(),
                   **(extra or {})}
        sent = False
        for attempt in range(1, _ATTEMPTS + 1):
            seconds = deadline.attempt_time() if deadline is not None else sum(self.timeouts)
            if seconds is None:
                raise S3Error(f"S3 {method} s3://{self.name}/{object_key} was not sent: the deadline passed",
                              uncertain=sent)
            conn = self._connection(seconds)
            # The whole exchange ends by the attempt's time: a server that answers a few bytes at a time never
            # trips a socket timeout, which bounds each read, so a timer closes the socket then.
            fired: list[bool] = []  # the timer ran: whatever was read after it is not an answer
            watchdog = threading.Timer(seconds, _shut, (conn, fired))
            watchdog.daemon = True
            try:
                conn.connect()
                watchdog.start()
                if conn.sock is not None:
                    conn.sock.settimeout(min(self.timeouts[1], seconds))
                signed = self._signer.sign(headers, body, method=method, path=path)
                sent = True
                conn.request(method, path, body=body or None, headers=signed)
                response = conn.getresponse()
                answer = _body(response, expect)
                if fired:  # cut at the attempt's end (http.client may take the cut for the end of the headers)
                    raise TimeoutError("the answer did not arrive within the attempt's time")
            except OSError as error:  # refused, reset, timed out, TLS; http.client's errors are OSErrors too
                if attempt < _ATTEMPTS and (deadline is None or deadline.allows(0.05)):
                    continue
                raise S3Error(f"S3 {method} s3://{self.name}/{object_key} failed: {type(error).__name__}",
                              uncertain=sent) from None
            except Exception as error:  # http.client.HTTPException: a broken answer
                raise S3Error(f"S3 {method} s3://{self.name}/{object_key} failed: {type(error).__name__}",
                              uncertain=sent) from None
            finally:
                watchdog.cancel()
                conn.close()
            status = response.status
            if status < 300:
                return (status, answer) if answer is not None else (_LENGTH_DIFFERS, b"")
            answer = answer or b""
            code = _code(answer)
            # A 404 is an object that is not there only when S3 says so (NoSuchKey): a bucket that is gone, or a
            # path no S3 serves, is a failure (S3 answers a DELETE of a missing object 204).
            if status == 404 and method == "GET" and code == "NoSuchKey":
                return status, answer
            if status >= 500 and attempt < _ATTEMPTS and (deadline is None or deadline.allows(0.05)):
                continue
            raise S3Error(f"S3 {method} s3://{self.name}/{object_key} failed: HTTP {status} {code}", code=code,
                          uncertain=status >= 500)
        raise AssertionError("unreachable")


_LENGTH_DIFFERS = -1  # `_request`'s status for a body announced at another length than expected
_ANSWER_BYTES = 1024 * 1024  # what is read of any other answer (an error's XML, a PUT's empty body)


def _body(response: Any, expect: int | None) -> bytes | None:
    """What is read of an answer: at most `expect` + 1 bytes of a 2xx body whose Content-Length, if any, is
    `expect` (None, unread, when it is another); at most _ANSWER_BYTES of any other."""
    if expect is None or response.status >= 300:
        return bytes(response.read(_ANSWER_BYTES))
    length = response.getheader("Content-Length")
    if length is not None and length.strip() != str(expect):
        return None
    return bytes(response.read(expect + 1))


def _endpoint_root(path: str) -> str:
    """An endpoint's path as botocore puts it before the bucket (path style): dot and empty segments resolved, then
    percent-encoded but for / and ~ (a % too: botocore encodes the path it is given once more); a ';', after which
    botocore drops the rest of its segment, is refused."""
    from ..aws.target import without_dot_segments

    if ";" in path:
        raise ValueError("the S3 endpoint URL's path (AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL) holds ';', which "
                         "botocore drops with the rest of its segment: write it as %3B")
    return quote(without_dot_segments(path), safe="/~").rstrip("/")


def _shut(conn: Any, fired: list[bool]) -> None:
    """End a connection's exchange now: its reads and writes fail at once."""
    import contextlib
    import socket

    fired.append(True)
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _code(answer: bytes) -> str:
    """S3's error code from its XML answer, or "?" (also for one that is no error code's name: a broken or hostile
    peer's text, which errors and logs never quote)."""
    start = answer.find(b"<Code>")
    end = answer.find(b"</Code>", start)
    if start < 0 or end < 0:
        return "?"
    code = answer[start + 6:end]
    return code.decode("ascii") if re.fullmatch(rb"[A-Za-z0-9_.-]{1,64}", code) else "?"


def from_environment(name: str, prefix: str, *, connect_timeout: float, read_timeout: float,
                     read_buckets: tuple[str, ...] = (), legacy_prefix: str | None = None) -> Bucket:
    """The bucket as the function's environment reaches it: AWS_REGION, the credentials Lambda sets, and
    AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL for a local S3; the CA bundle the DynamoDB client trusts.
    `read_buckets` and `legacy_prefix`: what else a pointer may name (`Bucket`)."""
    from ..aws.environment import ca_bundle, function_credentials

    # Lambda's environment, else (the CLI) botocore's chain; with none, empty ones, which S3 refuses.
    access, secret, token = function_credentials(os.environ) or ("", "", None)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ""
    try:
        return Bucket(name, prefix, region=region, credentials=(access, secret, token),
                      connect_timeout=connect_timeout, read_timeout=read_timeout, endpoint=endpoint,
                      cafile=ca_bundle(os.environ) if not (endpoint or "").startswith("http:") else None,
                      read_buckets=read_buckets, legacy_prefix=legacy_prefix)
    except ValueError as error:  # the endpoint: said as the setting's error, init fails (the CLI: exit 2)
        from ..errors import IdempotencyConfigurationError

        raise IdempotencyConfigurationError(f"IDEMPOTENCY_LARGE_RESULTS_BUCKET: {error}") from None
