"""What the layer will do with one event, decided before anything runs: a plan, pure data.

`sources.plan(config, keys, event)` makes one for every event; `executor.Executor.run` carries it out against the
cycle, and the operator CLI reads the same plan to say which keys an event has. A plan is the event's kind and its
units of work: one unit for a whole event or an HTTP request, one per record for a batch.

    kind      units                                          carried out as
    DURABLE   none                                           the handler, unclaimed (a durable execution's)
    EXECUTION one: the durable execution's input's key       claim as the execution, run; the answer settles it;
                                                             or the stored result (another execution's copy)
    EVENT     one: the event's key (or none)                 claim, run, complete or release; or replay
    HTTP      one: the request's scoped key (or none)        the same, the layer's errors answered as problems
    BATCH     one per record: key, fingerprint, group        claims, one handler call, each record settled

A unit without a key runs unguarded, unless it is `refused`: then the record is reported failed (a batch's), or
the whole invocation answers the plan's `refusal`. `notes` are what the plan asks to be logged, in order, when it
is carried out (a note with a name is said once per environment).
"""

from __future__ import annotations

from collections import namedtuple

DURABLE, EXECUTION, EVENT, HTTP, BATCH = "durable", "execution", "event", "http", "batch"


# Why a unit cannot run (Unit.refused).
NO_KEY, REQUIRED, NO_FINGERPRINT, MISMATCH = "key", "required", "fingerprint", "mismatch"


TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, NamedTuple

if TYPE_CHECKING:
    class _UnitFields(NamedTuple):
        key: str | None  # the stored key; None: it has none
        fingerprint: str | None = None  # the payload's, when one is compared
        position: int = 0  # the record's place in the batch
        group: Any = None  # its ordering group: a record that cannot run stops the later ones of its group
        # why it cannot run: NO_KEY (its key cannot be derived), REQUIRED (none, under IDEMPOTENCY_REQUIRE_KEY),
        # NO_FINGERPRINT, MISMATCH (an earlier record's key with another payload)
        refused: str | None = None
        first: int | None = None  # another record of the batch with the same key, before it: that one's index
        why: str | None = None  # the error that refused it, in words (no event content)
        # HTTP: the key the request had before an upgrade changed what keys are made of, read by a first run
        # (IDEMPOTENCY_HTTP_PREVIOUS_KEYS), so a retry that straddles the upgrade is replayed; None: not read
        previous: str | None = None
else:
    _UnitFields = namedtuple("Unit", ("key", "fingerprint", "position", "group", "refused", "first", "why",
                                      "previous"), defaults=(None, 0, None, None, None, None, None))


class Unit(_UnitFields):
    """One unit of work: a whole event, a request, or a batch's record."""
    __slots__ = ()


if TYPE_CHECKING:
    class _NoteFields(NamedTuple):
        level: int
        message: str  # no event content: keys, indexes, names of settings
        key: str | None = None
        outcome: str | None = None
        once: str | None = None  # said once per environment under this name
        metric: str | None = None  # a count added to the invocation's tally each time, said or not
else:
    _NoteFields = namedtuple("Note", ("level", "message", "key", "outcome", "once", "metric"),
                             defaults=(None, None, None, None))


class Note(_NoteFields):
    """A line the plan asks to be logged: `level` a logging level, `key` and `outcome` its fields; `metric`, a
    count it adds to (`metrics.COUNTS`) every time it is carried out, when it is said only once."""
    __slots__ = ()


if TYPE_CHECKING:
    class _PlanFields(NamedTuple):
        kind: str  # DURABLE, EXECUTION, EVENT, HTTP or BATCH
        units: tuple[Unit, ...] = ()
        request: Any = None  # HTTP: the parsed request (sources.http.Request)
        batch: Any = None  # BATCH: the parsed batch (sources.batches.Batch)
        refusal: Exception | None = None
        notes: tuple[Note, ...] = ()
        execution: str | None = None  # EXECUTION: the durable execution's ARN, the owner of its claim
else:
    _PlanFields = namedtuple("Plan", ("kind", "units", "request", "batch", "refusal", "notes", "execution"),
                          defaults=((), None, None, None, (), None))


class Plan(_PlanFields):
    """An event's kind, its units, what its source parsed, and the error the whole invocation answers before
    anything runs (`refusal`: raised, or for an HTTP request said as a 400 problem response)."""
    __slots__ = ()
