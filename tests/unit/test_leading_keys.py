"""Per-function isolation under an IAM `dynamodb:LeadingKeys` condition (issue 44: T1.1, T1.4; R1.1, R1.4).

IAM cannot run here (nothing in these tests reaches AWS). The condition is emulated as the security review's harness
emulates it (security-2026-12.md, Appendix A; tests/support/leading_keys.py): the layer is built in process with
`interceptor.build` on the in-memory table behind a transport that refuses, with `AccessDeniedException`, any
request naming a partition key that matches none of the policy's `StringLike` patterns. With the patterns a
function's role would carry, `<P>#*` (or `idempotency#<P>` in the sort-key layout), every source must pass init,
run once and replay, with no key denied. Handler runs are counted by the handler itself (`World.runs`).
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from idempotency_layer import config as _config
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from tests.support.inprocess import Context
from tests.support.leading_keys import LeadingKeys
from tests.support.memory_dynamodb import MemoryDynamoDB, MemoryTransport

P = "orders"
BASE = {"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "IDEMPOTENCY_TABLE": "shared",
        "AWS_LAMBDA_FUNCTION_NAME": P, "AWS_REGION": "us-east-1"}
SORT_KEY = {"IDEMPOTENCY_KEY_ATTR": "pk", "IDEMPOTENCY_SORT_KEY_ATTR": "sk"}
# (settings of the layout, the policy's patterns, the table's partition key attribute)
LAYOUTS = {"partition key": ({}, [f"{P}#*"], "id"),
           "sort key": (SORT_KEY, [f"idempotency#{P}"], "pk")}


@pytest.fixture(scope="module")
def interceptor() -> Any:
    """The interceptor module, imported disabled (its import-time init builds nothing), for its `build`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IDEMPOTENCY_DISABLED", "true")
        patch.setenv("IDEMPOTENCY_ORIGINAL_HANDLER", "json.dumps")
        yield importlib.import_module("idempotency_layer.interceptor")


class World:
    """The layer built as at an init, with `settings`, on an in-memory table behind the emulated policy."""

    def __init__(self, interceptor: Any, layout: str, patterns: list[str] | None = None, **settings: str) -> None:
        layout_settings, default_patterns, key_attr = LAYOUTS[layout]
        self.config = _config.load({**BASE, **layout_settings, **settings})
        self.db = MemoryDynamoDB(key_attr, "sk" if layout == "sort key" else None)
        self.policy = LeadingKeys(MemoryTransport(self.db), default_patterns if patterns is None else patterns,
                                  key_attr)
        self.runs: list[Any] = []  # each event (or record) the handler was given: its own side effect
        self.answer: Any = lambda event: {"done": len(self.runs)}
        self.handler = interceptor.build(self.config, self._user, transport=self.policy)

    def _user(self, event: Any, context: Any) -> Any:
        self.runs.append(event)
        return self.answer(event)

    def __call__(self, event: Any) -> Any:
        return self.handler(event, Context())


# -- the Powertools migration (R1.4, T1.4) ---------------------------------------------------------------------

POWERTOOLS = {"IDEMPOTENCY_POWERTOOLS_HANDLER": "app.handler", "IDEMPOTENCY_KEY_JMESPATH": "orderId"}


def test_a_denied_powertools_read_names_the_statement_to_grant_and_nothing_runs(interceptor):
    world = World(interceptor, "partition key", **POWERTOOLS)
    with pytest.raises(IdempotencyPersistenceLayerError) as caught:
        world({"orderId": "o-1"})
    assert str(caught.value) == (
        "the function's role may not read the Powertools record of this invocation: grant dynamodb:GetItem on keys "
        "'orders.app.handler#*' (a GetItem-only statement, docs/security.md)")
    assert caught.value.denied and caught.value.permanent
    assert world.runs == []
    assert world.db.items == {}  # the layer's own claim released: a retry after the grant runs
    assert [(seen.operation, seen.key.partition("#")[0]) for seen in world.policy.denied] == [
        ("GetItem", "orders.app.handler")]
    world.policy.patterns.append("orders.app.handler#*")  # the GetItem-only statement, granted
    assert world({"orderId": "o-1"}) == {"done": 1}
    assert len(world.runs) == 1


def test_a_powertools_read_failing_otherwise_keeps_its_own_words(interceptor):
    world = World(interceptor, "partition key", [f"{P}#*", f"{P}.app.handler#*"], **POWERTOOLS)

    class Throttled:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def call(self, operation: str, params: dict, deadline: Any = None) -> dict:
            if operation == "GetItem" and params.get("ProjectionExpression"):
                from idempotency_layer.stores.dynamodb import DynamoDBError

                raise DynamoDBError(operation, "ProvisionedThroughputExceededException", "slow down", status=400)
            return self.inner.call(operation, params, deadline)

    world.policy.inner = Throttled(world.policy.inner)
    with pytest.raises(IdempotencyPersistenceLayerError, match="ProvisionedThroughputExceededException") as caught:
        world({"orderId": "o-2"})
    assert "Powertools record" not in str(caught.value) and not caught.value.denied
    assert world.runs == []
