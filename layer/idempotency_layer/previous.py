"""A request's previous key: the record an earlier version of the layer stored for it, read by a first run.

When what a key is made of changes (HTTP keys gained the API, the stage and ALB's target group), a retry whose first
send ran before the upgrade has a record under its old key, not its new one; without this, it would run again.
With IDEMPOTENCY_HTTP_PREVIOUS_KEYS=consult (the default), a first run, once the layer holds its claim on the new
key, reads the record under the old one (one consistent read), and judges it as a claim would:

    none, expired, or a claim that ended          the handler runs
    another payload (its fingerprint differs)     422 (the mismatch), our claim released
    a live claim                                  in progress (409, or waited for), our claim released
    completed                                     its result replayed, and kept as the new key's record

Replays and later copies never read it: they find the new key's record. Removable (`off`) one
IDEMPOTENCY_TTL_SECONDS after the upgrade, when every record under an old key has expired.
"""

from __future__ import annotations

from .cycle import Earlier
from .errors import IdempotencyPayloadMismatchError, IdempotencyPersistenceLayerError
from .keys import check_fingerprint
from .stores.protocol import COMPLETED

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .deadline import Deadline
    from .keeping import Keeper
    from .results import Results
    from .stores.protocol import Record, Store


def reader(store: Store, keeper: Keeper, key: str, fingerprint: str | None, results: Results,
           clock: Callable[[], float], withheld: Callable[[Any], bool],
           authenticate: Callable[[Record], None]) -> Callable[[Deadline], Earlier | None]:
    """The read of previous key `key` for a request whose payload has `fingerprint`: what its record says (an
    `Earlier`), or None. A result `withheld` refuses (one the new version would not have stored) is as none. A
    completed record must pass `authenticate` (the cycle's record MAC, when one is set) before it is decoded."""

    def read(deadline: Deadline) -> Earlier | None:
        record = store.get(key, deadline)
        now = clock()
        if record is None or record.is_expired(now) or (record.status != COMPLETED and record.is_claim_expired(now)):
            return None
        said = f"the record under its previous key {key!r}"
        try:
            check_fingerprint(key, record.fingerprint, fingerprint)
        except IdempotencyPayloadMismatchError:
            return Earlier(said, completed=record.status == COMPLETED, mismatch=True)
        if record.status != COMPLETED:
            return Earlier(said, completed=False)
        authenticate(record)  # raises for a record that is not authentic: never decoded or replayed
        if record.result is None:
            raise IdempotencyPersistenceLayerError(f"record {key!r} is completed but has no result format")
        value = keeper.decode(key, record.result, results, deadline)  # raises for one it cannot hand back
        if withheld(value):
            return None
        return Earlier(said, completed=True, value=value, ours=True)

    return read
