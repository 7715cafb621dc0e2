"""The codec's values, as a chained wrapper gets them on replay: the runtime's marshaller must write the restored
value as it wrote the original (awslambdaric's own marshaller, in-process)."""

from __future__ import annotations

import enum
from decimal import Decimal
from typing import Any, NamedTuple

from awslambdaric.lambda_runtime_marshaller import LambdaMarshaller
from hypothesis import example, given, settings
from hypothesis import strategies as st

from idempotency_layer import codec

_marshal = LambdaMarshaller().marshal_response


class Colour(str, enum.Enum):
    RED = "red"


class Pair(NamedTuple):
    a: Any
    b: Any


def restored(value: Any) -> Any:
    return codec.decode(codec.encode(value))


def test_non_finite_float_keys_are_written_as_the_runtime_writes_them() -> None:
    value = {float("inf"): 1, float("-inf"): 2, float("nan"): 3, 1.5: 4}
    assert _marshal(restored(value)) == _marshal(value)
    assert list(restored(value)) == ["Infinity", "-Infinity", "NaN", "1.5"]


def test_results_deeper_than_orjson_goes_are_kept() -> None:
    value: Any = {"price": Decimal("1.50"), "n": 2**70}
    for i in range(400):  # orjson stops at 255 levels; the runtime's marshaller does not
        value = [value] if i % 2 else {"d": value}
    encoded = codec.encode(value)
    assert encoded.format == codec.TAGGED
    assert codec.decode(encoded) == value
    assert _marshal(codec.decode(encoded)) == _marshal(value)


_text = st.text(st.characters(codec="utf-8"), max_size=8)
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-(2**100), 2**100), st.floats(), _text,
                     st.just(Colour.RED), st.decimals(), st.binary(max_size=8).map(lambda b: b.hex().encode()))
_values = st.one_of(st.binary(max_size=16), st.recursive(_scalars, lambda children: st.one_of(
    st.lists(children, max_size=4), st.lists(children, max_size=3).map(tuple), st.builds(Pair, children, children),
    st.dictionaries(_text, children, max_size=4),
    st.dictionaries(st.one_of(st.integers(), st.floats(), st.booleans(), st.none()), children, max_size=1)),
    max_leaves=25))


@settings(max_examples=300, deadline=None, derandomize=True)
@example(value={"k": {float("-inf"): Pair(Decimal("1.50"), Colour.RED)}})
@given(value=_values)
def test_the_runtime_writes_a_restored_value_as_it_wrote_the_original(value: Any) -> None:
    try:
        expected = _marshal(value)
    except Exception:  # the runtime refuses it: the layer never stores it
        return
    assert _marshal(restored(value)) == expected
