import collections
import enum
import os
import zlib
from decimal import Decimal

import orjson
import pytest

from idempotency_layer import codec


def roundtrip(value):
    return codec.decode(codec.encode(value))


@pytest.mark.parametrize("value", [None, {}, [], 0, 0.0, "", False, True, {"a": [1, {"b": None}]}, "é😀"])
def test_plain_values_roundtrip_including_falsy(value):
    encoded = codec.encode(value)
    assert encoded.format == codec.JSON
    back = codec.decode(encoded)
    assert back == value and type(back) is type(value)


def test_decimal_is_exact():
    value = {"price": Decimal("19.990000000000000000001"), "n": [Decimal("1E+2")]}
    encoded = codec.encode(value)
    assert encoded.format == codec.TAGGED
    back = codec.decode(encoded)
    assert back == value
    assert str(back["price"]) == "19.990000000000000000001"
    assert isinstance(back["n"][0], Decimal)


def test_bytes_come_back_as_bytes():
    assert roundtrip(b"\x00\xffbinary") == b"\x00\xffbinary"
    assert roundtrip({"blob": b"x"}) == {"blob": b"x"}


def test_user_dict_that_looks_like_a_tag_is_not_mistaken():
    value = {"a": {"$decimal": "1.5"}, "b": {"$object": 1}, "c": Decimal(1)}
    assert roundtrip(value) == value


def test_big_ints_and_tuples_and_namedtuples():
    point = collections.namedtuple("Point", "x y")
    value = {"big": 2**70, "neg": -(2**70), "t": (1, 2), "p": point(1, Decimal(2))}
    assert roundtrip(value) == {"big": 2**70, "neg": -(2**70), "t": [1, 2], "p": {"x": 1, "y": Decimal(2)}}


def test_subclasses_take_their_base_value():
    class Color(str, enum.Enum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 3

    back = roundtrip({"c": Color.RED, "l": Level.HIGH, "d": Decimal(1)})
    assert back == {"c": "red", "l": 3, "d": Decimal(1)}
    assert type(back["c"]) is str and type(back["l"]) is int


def test_non_string_keys_become_strings_like_the_runtime_does():
    assert roundtrip({2: "a", True: "b", None: "c", 1.5: "d", "e": Decimal(0)}) == {
        "2": "a", "true": "b", "null": "c", "1.5": "d", "e": Decimal(0)
    }


def test_unstorable_types_are_refused():
    with pytest.raises(codec.ResultNotEncodable):
        codec.encode({"s": {1, 2}, "d": Decimal(1)})


def test_large_results_are_compressed():
    value = {"rows": [{"id": i, "name": f"name-{i}", "tags": ["a", "b"]} for i in range(20_000)]}
    encoded = codec.encode(value)
    assert encoded.format == codec.JSON + codec.COMPRESSED
    assert len(encoded.data) < len(orjson.dumps(value))
    assert codec.decode(encoded) == value


def test_small_results_are_not_compressed():
    assert codec.encode({"x": "y" * 100}).format == codec.JSON


def test_incompressible_result_over_the_budget_is_too_large():
    value = {"noise": os.urandom(600_000).hex()}
    encoded = codec.encode(value)
    assert encoded == codec.Encoded(codec.TOO_LARGE, None)
    with pytest.raises(ValueError):
        codec.decode(encoded)


def test_compressed_result_fits_the_budget():
    text = os.urandom(150_000).hex()  # 300 KB of hex compresses to about half
    encoded = codec.encode(text, budget=200_000)
    assert encoded.format == codec.JSON + codec.COMPRESSED
    assert len(encoded.data) <= 200_000
    assert zlib.decompress(encoded.data) == orjson.dumps(text)
    assert codec.decode(encoded) == text


def test_decode_accepts_text_data():
    assert codec.decode(codec.Encoded(codec.JSON, '{"a":1}')) == {"a": 1}


def test_non_finite_floats_come_back_as_themselves():
    import math

    back = roundtrip({"nan": float("nan"), "inf": float("inf"), "neg": [float("-inf")], "none": None})
    assert math.isnan(back["nan"]) and back["inf"] == math.inf and back["neg"] == [-math.inf]
    assert back["none"] is None
    assert codec.encode({"none": None, "x": 1.5}).format == codec.JSON  # a plain null stays on the fast path


def test_lone_surrogate_is_refused_not_crashed():
    with pytest.raises(codec.ResultNotEncodable):
        codec.encode({"text": "\ud800"})
