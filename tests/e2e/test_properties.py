"""Property: for every result the runtime's marshaller accepts, the replay's bytes equal the first response's,
under the real runtime and the built layer. Values travel pickled in the event; the function returns them."""

from __future__ import annotations

import base64
import os
import pickle
import sys
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import APPS, Environments, Executions, marker, same_as_first

sys.path.insert(0, str(APPS))
from values import Colour, Point, Row

EXAMPLES = int(os.environ.get("IDEMLAYER_PROPERTY_EXAMPLES", "60")) // 2

_text = st.text(st.characters(codec="utf-8"), max_size=10)
_keys = st.one_of(_text, st.just(Colour.RED), _text.map(str.encode), st.integers(-(2**70), 2**70), st.booleans(),
                  st.none(), st.floats(allow_nan=False))
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-(2**100), 2**100), st.floats(), _text,
                     st.sampled_from([Colour.BLUE, float("nan"), -0.0, "\x00"]), st.decimals(allow_nan=False))


def results_of(scalars: Any, keys: Any) -> Any:
    """Results a handler may return: bytes, or `scalars` nested in lists, tuples, dicts keyed by `keys`, named
    tuples and objects with `_asdict()` (test_results_shapes.py draws them too)."""
    return st.one_of(st.binary(max_size=32), st.recursive(
        scalars,
        lambda children: st.one_of(st.lists(children, max_size=4), st.lists(children, max_size=3).map(tuple),
                                   st.dictionaries(keys, children, max_size=4), st.builds(Point, children, children),
                                   st.builds(lambda v: Row(v=v), children)),
        max_leaves=20,
    ))


def pickled(value: Any) -> str:
    """`value` as it travels in an event to the function, which unpickles and returns it."""
    return base64.b64encode(pickle.dumps(value)).decode()


_results = results_of(_scalars, _keys)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=_results)
def test_replay_equals_the_first_response(primary: str, environments: Environments, shared_table: str,
                                          executions: Executions, value: Any) -> None:
    env = environments.shared(primary, shared_table)
    event = {"marker": marker(), "action": "pickled", "value": pickled(value)}
    first = env.invoke(event)
    second = env.invoke(event)
    same_as_first(first, second, executions, event["marker"])
