"""Record authentication (IDEMPOTENCY_RECORD_MAC_KEY): the MAC a completion seals its record with, and the check
every completed record passes before any use of it (docs/record-authentication.md). Pure but for `keyed`, which
reads the keys (`aws.secrets.read_secret`) for the interceptor at init and for the CLI's show and doctor, so that
both read them alike.

A completed record's MAC is HMAC-SHA256, under the key of its key id, over the canonical encoding of

    (FORMAT, key id, store id, record key, status, expires_at, owner, result_format, result bytes, fingerprint)

stored as `mac` = `<key id>:<base64>`. The store id binds a record to its store (a table, a Valkey database), the
record key to its key: a record copied to another key or store fails. The result bytes of a pointer to the
large-results bucket are the pointer's JSON, which names the object's SHA-256, so the object is bound too.

In-progress records are not sealed: a claim carries no result to replay, so a forged one can only make copies
wait or be refused (a denial of service, which only the store's permissions prevent), never make a forged value
be used.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from hashlib import sha256

from .errors import IdempotencyConfigurationError, IdempotencyPersistenceLayerError
from .stores.protocol import COMPLETED

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Mapping

    from . import codec
    from .config import Config
    from .stores.protocol import Record

SETTING = "IDEMPOTENCY_RECORD_MAC_KEY"
FORMAT = 1  # the canonical tuple's layout; a new layout takes a new number, so no two layouts share an encoding
MIN_KEY_BYTES = 32
KEY_ID_CONTEXT = b"idempotency-layer key id"
KEYS_S = 3.0  # the most reading the keys may take, every source together (at init: Lambda's init has 10 s)


def key_id(key: bytes) -> str:
    """The key's public name: 8 hex characters of HMAC-SHA256(key, KEY_ID_CONTEXT), which tell keys apart and
    say nothing of them."""
    return hmac.new(key, KEY_ID_CONTEXT, sha256).hexdigest()[:8]


def _part(value: str | bytes | int | None) -> bytes:
    """One value of the tuple: a type tag, then (but for None) its length in 4 bytes and its bytes. The tag tells
    None from empty, text from bytes, a number from its digits."""
    if value is None:
        return b"N"
    if isinstance(value, int):
        tag, data = b"I", str(value).encode()
    elif isinstance(value, str):
        tag, data = b"S", value.encode("utf-8", "surrogatepass")
    else:
        tag, data = b"B", bytes(value)
    return tag + len(data).to_bytes(4, "big") + data


def canonical(*values: str | bytes | int | None) -> bytes:
    """The values as one string of bytes that no other sequence of values encodes to: each length-prefixed and
    tagged, the count first."""
    return len(values).to_bytes(2, "big") + b"".join(_part(value) for value in values)


def _result_bytes(data: str | bytes | None) -> bytes | None:
    # A store may hand text back as bytes or the other way (by the format), so the MAC covers the bytes.
    return data.encode() if isinstance(data, str) else data


class RecordMac:
    """The keys of one store: the current one seals completions, every one is accepted (rotation). `store_id`
    names the store (Store.identity)."""

    __slots__ = ("_keys", "current", "store_id")

    def __init__(self, keys: list[bytes], store_id: str) -> None:
        if not keys:
            raise IdempotencyConfigurationError(f"{SETTING}: no key")
        for index, key in enumerate(keys, 1):
            if len(key) < MIN_KEY_BYTES:
                raise IdempotencyConfigurationError(
                    f"{SETTING}: the key of entry {index} has {len(key)} bytes; at least {MIN_KEY_BYTES} are required "
                    "(e.g. 32 random bytes, base64 encoded: `openssl rand -base64 32`)"
                )
        self._keys = {key_id(key): key for key in keys}
        if len(self._keys) != len(keys):
            raise IdempotencyConfigurationError(f"{SETTING}: two entries hold the same key")
        self.current = key_id(keys[0])
        self.store_id = store_id

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def _digest(self, kid: str, key: str, expires_at: int, owner: str | None, result: codec.Encoded | None,
                fingerprint: str | None) -> bytes:
        form, data = (None, None) if result is None else (result.format, _result_bytes(result.data))
        message = canonical(FORMAT, kid, self.store_id, key, COMPLETED, expires_at, owner, form, data, fingerprint)
        return hmac.new(self._keys[kid], message, sha256).digest()

    def seal(self, key: str, expires_at: int, owner: str | None, result: codec.Encoded,
             fingerprint: str | None) -> str:
        """The `mac` of the completed record these values make, under the current key."""
        digest = self._digest(self.current, key, expires_at, owner, result, fingerprint)
        return f"{self.current}:{base64.b64encode(digest).decode()}"

    def fault(self, record: Record) -> str | None:
        """Why the completed `record` is not authentic, or None when its MAC holds under a configured key."""
        mac = record.mac
        if not mac:
            return "it has no mac"
        kid, _, encoded = mac.partition(":")
        if kid not in self._keys:
            return f"its key id {kid[:8]!r} is not configured"
        try:
            given = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            return "its mac is malformed"
        expected = self._digest(kid, record.key, record.expires_at, record.owner, record.result, record.fingerprint)
        return None if hmac.compare_digest(given, expected) else "its mac does not match"

    def check(self, record: Record) -> None:
        """Raise the store's permanent error unless the completed `record` is authentic: it is then never decoded,
        replayed or taken as done (HTTP 503, a batch record reported failed)."""
        fault = self.fault(record)
        if fault is not None:
            raise IdempotencyPersistenceLayerError(
                f"the completed record of key {record.key!r} failed its authentication ({fault}; {SETTING}): it "
                "was not written by this function under a configured key, so it is not used; the handler did not run",
                permanent=True, integrity=True,
            )


def keyed(config: Config, env: Mapping[str, str], store_id: str) -> RecordMac:
    """The record MAC of `config`'s IDEMPOTENCY_RECORD_MAC_KEY for the store `store_id`: its keys read once, from
    `env` (an `env:` source) and as `env`'s credentials, within KEYS_S; IdempotencyConfigurationError (naming the
    setting and the source, never a key) when a key cannot be read or is not one."""
    from .aws.secrets import read_secret
    from .deadline import Deadline

    by = Deadline.after(KEYS_S).at  # (time.monotonic()'s clock)
    return RecordMac([read_secret(source, env, by) for source in config.record_mac_sources], store_id)
