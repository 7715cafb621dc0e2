"""The record protocol every backend speaks: a record's states, the Record itself, and the Store.

A record of a key goes through these states; every write after a claim names the claim's owner, so an
invocation never completes or deletes a claim another one took over, and expiry is judged by the write's
condition (a record past its time may still be there), never by presence:

      (none, or expired) --claim--> INPROGRESS --complete--> COMPLETED --(expires_at)--> (expired)
                                        |  \\--(in_progress_until: the claim expired)--> (claimable)
                                        \\--release--> (none)

A backend is a sibling under stores/ (dynamodb/, valkey/) that imports this module and no other backend; the
opener (stores/__init__.py) is the one place one is chosen. Every store keeps a record within the same budget
(codec.ITEM_LIMIT, DynamoDB's item size, which the Valkey store is held to as well), so a result one store keeps
every store keeps.
"""

from __future__ import annotations

from collections import namedtuple

from .. import codec
from ..deadline import Deadline

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NamedTuple, Protocol
else:
    Protocol = object  # the interface's documentation at run time; structural for type checkers

# A store's `read` takes at most this many keys a request (DynamoDB's BatchGetItem limit; the Valkey store
# pipelines as many reads).
READ_KEYS = 100
INPROGRESS = "INPROGRESS"
COMPLETED = "COMPLETED"


if TYPE_CHECKING:
    class _RecordFields(NamedTuple):
        key: str
        status: str
        expires_at: int  # epoch seconds
        in_progress_until: int | None  # epoch ms
        owner: str | None
        result: codec.Encoded | None  # None while in progress
        fingerprint: str | None = None  # SHA-256 of the claiming event's payload (IDEMPOTENCY_PAYLOAD_JMESPATH)
        mac: str | None = None  # a completed record's `<key id>:<base64>` (IDEMPOTENCY_RECORD_MAC_KEY, record_mac)
else:
    _RecordFields = namedtuple("Record", (
        "key",
        "status",
        "expires_at",
        "in_progress_until",
        "owner",
        "result",
        "fingerprint",
        "mac",
    ), defaults=(None, None))


class Record(_RecordFields):

    __slots__ = ()

    def is_expired(self, now: float) -> bool:
        return self.expires_at < int(now)

    def is_claim_expired(self, now: float) -> bool:
        return self.in_progress_until is not None and self.in_progress_until < int(now * 1000)


class Store(Protocol):
    """What the cycle, the executor and the CLI need from a backend: every name they use on a store."""

    name: str
    """The store as output shows it: the table's name, the Valkey server's endpoint."""
    where: str
    """The store as messages say it ("table 'orders-idem'", "Valkey host:6379")."""
    read_grant: str
    """What the function must be allowed for `read`, in the backend's own words (a log says it when refused)."""
    identity: str
    """The store a completed record's MAC binds it to (record_mac): a record copied to another store fails."""

    def verify(self, deadline: Deadline | None = None) -> None:
        """Check at init that the store keeps what it is given as the settings describe it (raises the layer's
        IdempotencyConfigurationError when definitely not); one that cannot be reached is checked again before
        the first claim."""

    def claim(self, key: str, owner: str, now: float, in_progress_until: int, expires_at: int,
              fingerprint: str | None = None, deadline: Deadline | None = None) -> Record | None:
        """Write an in-progress record unless a live one exists. None: we hold the claim; else the live record.
        `deadline`: give up by then, with `IdempotencyPersistenceLayerError`."""

    def complete(self, key: str, owner: str, result: codec.Encoded, expires_at: int,
                 deadline: Deadline | None = None, seal: Callable[[codec.Encoded], str] | None = None) -> bool:
        """Mark our claim completed with its result. False: the claim is no longer ours. `deadline`:
        give up by then, with `IdempotencyPersistenceLayerError`. `seal`: the record's `mac` for the result it
        is completed with (the one given, or none when the store completes without it), stored with it."""

    def release(self, key: str, owner: str, deadline: Deadline | None = None) -> bool:
        """Delete our claim. True: it is gone (deleted now, or already: a request sent again whose first copy
        landed). False: another invocation's record is there, and nothing was deleted."""

    def get(self, key: str, deadline: Deadline | None = None) -> Record | None:
        """The record of `key` (a consistent read), or None. `deadline`: give up by then."""

    def peek(self, key: str, deadline: Deadline | None = None) -> Record | None:
        """The record of `key` without its result (a consistent read), or None: whether a result this
        environment keeps in memory is still the record's. `deadline`: give up by then."""

    def read(self, keys: list[str], deadline: Deadline | None = None, whole: bool = False
             ) -> tuple[dict[str, Record], list[str]]:
        """Up to `READ_KEYS` records in one consistent read, without their results: the records read, by key (a
        key without a record, or whose item is not one, is left out), and the keys the store left unread.
        `deadline`: give up by then. `whole`: with each record's owner, result and `mac` too, so that it can be
        authenticated (record_mac)."""

    def purge(self, key: str, status: str, owner: str | None) -> bool:
        """Delete the record of `key` if it still has the `status` and `owner` an operator was shown (the CLI's
        purge). False: it changed since, and nothing was deleted."""
