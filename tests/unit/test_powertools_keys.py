"""The keys and payload hashes the layer reads Powertools' records by are Powertools' own (issue 29): compared, over
generated JSON events, with what the real `aws-lambda-powertools` package's persistence layer computes."""

from __future__ import annotations

import os
import warnings

import pytest
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig
from aws_lambda_powertools.utilities.idempotency.persistence.base import BasePersistenceLayer
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.keys import KeyDeriver, powertools_hash, powertools_key
from idempotency_layer.powertools import judge

EXAMPLES = int(os.environ.get("IDEMLAYER_PROPERTY_EXAMPLES", "60"))
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


class _Powertools(BasePersistenceLayer):
    """Powertools' own key and hash code, without a table."""

    def _get_record(self, idempotency_key):  # pragma: no cover - never called
        raise NotImplementedError

    _put_record = _update_record = _delete_record = _get_record


def _powertools(expression: str | None, payload: str | None = None) -> _Powertools:
    layer = _Powertools()
    # The prefix Powertools makes of AWS_LAMBDA_FUNCTION_NAME and the handler's module.qualname, given whole.
    layer.configure(IdempotencyConfig(event_key_jmespath=expression or "", payload_validation_jmespath=payload),
                    function_name="app.handler", key_prefix="payments.app.handler")
    return layer


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(event=st.dictionaries(st.text(max_size=5), _json, max_size=4), order=_json, amount=_json)
def test_keys_and_payload_hashes_are_powertools_own(event, order, amount):
    event = {**event, "orderId": order, "amount": amount}
    for expression in (None, "orderId", "[orderId, amount]", "{o: orderId}"):
        ours = KeyDeriver("unused", expression, "amount")
        theirs = _powertools(expression, "amount")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Powertools warns of an event without a key
            expected = theirs._get_hashed_idempotency_key(event)
        assert powertools_key("payments.app.handler", ours.select(event)) == expected
        assert powertools_hash(ours.select_payload(event)) == theirs._get_hashed_payload(event)


NOW = 1_800_000_000.0


@pytest.mark.parametrize(("item", "verdict"), [
    ({"status": {"S": "COMPLETED"}, "expiration": {"N": str(int(NOW) + 60)}, "data": {"S": '{"a": 1}'}},
     ("completed", {"a": 1})),
    ({"status": {"S": "COMPLETED"}, "expiration": {"N": str(int(NOW) + 60)}, "data": {"S": "{}"}},
     ("completed", {})),  # the value itself, where Powertools' own replay would give None
    ({"status": {"S": "COMPLETED"}, "expiration": {"N": str(int(NOW))}, "data": {"S": '{"a": 1}'}},
     ("completed", {"a": 1})),  # Powertools: expired only once int(now) is past it
    ({"status": {"S": "COMPLETED"}, "expiration": {"N": str(int(NOW) - 1)}, "data": {"S": '{"a": 1}'}}, None),
    ({"status": {"S": "INPROGRESS"}, "expiration": {"N": str(int(NOW) + 60)},
      "in_progress_expiration": {"N": str(int(NOW * 1000) + 5000)}}, ("in progress", None)),
    ({"status": {"S": "INPROGRESS"}, "expiration": {"N": str(int(NOW) + 60)},
      "in_progress_expiration": {"N": str(int(NOW * 1000) - 1)}}, None),  # Powertools would take it over
    ({"status": {"S": "INPROGRESS"}, "expiration": {"N": str(int(NOW) + 60)}}, ("in progress", None)),
    ({"status": {"S": "INPROGRESS"}, "expiration": {"N": str(int(NOW) + 60)}, "validation": {"S": "other"},
      "in_progress_expiration": {"N": str(int(NOW * 1000) - 1)}}, None),  # taken over whatever its payload
])
def test_a_record_is_judged_as_powertools_would(item, verdict):
    found = judge("k", item, "x", True, NOW)
    if verdict is None:
        assert found is None
    else:
        assert ("completed" if found.completed else "in progress", found.value) == verdict


@pytest.mark.parametrize("item", [
    {"status": {"S": "COMPLETED"}},
    {"status": {"S": "COMPLETED"}, "expiration": {"S": "soon"}},
    {"status": {"S": "COMPLETED"}, "expiration": {"N": str(int(NOW) + 60)}, "data": {"S": "{not json"}},
    {"status": {"S": "EXPIRED"}, "expiration": {"N": str(int(NOW) + 60)}},  # Powertools: inconsistent state
    {"status": {"S": "completed"}, "expiration": {"N": str(int(NOW) + 60)}, "data": {"S": "{}"}},
])
def test_a_record_powertools_would_not_write_or_run_on_fails_closed(item):
    with pytest.raises(IdempotencyPersistenceLayerError, match="the handler did not run"):
        judge("k", item, None, False, NOW)
