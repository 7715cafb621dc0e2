import base64
import gzip
import hashlib
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.errors import IdempotencyConfigurationError, IdempotencyKeyError
from idempotency_layer.keys import KeyDeriver, canonical_json


def test_canonical_json_sorts_keys_without_whitespace():
    assert canonical_json({"b": 1, "a": {"d": [1, 2], "c": None}}) == b'{"a":{"c":null,"d":[1,2]},"b":1}'


def test_key_is_prefix_and_sha256_of_canonical_json():
    key = KeyDeriver("fn", "orderId").key({"orderId": "o-1", "other": 2})
    assert key == "fn#" + hashlib.sha256(b'"o-1"').hexdigest()


def test_whole_event_by_default_independent_of_key_order():
    keys = KeyDeriver("fn", None)
    assert keys.key({"a": 1, "b": 2}) == keys.key({"b": 2, "a": 1})
    assert keys.key({"a": 1}) != keys.key({"a": 2})


def test_same_key_in_another_process():
    code = (
        "import sys; sys.path.insert(0, 'layer');"
        "from idempotency_layer.keys import KeyDeriver;"
        "print(KeyDeriver('fn', '[customerId, orderId]').key({'orderId': 'o', 'customerId': 'c', 'x': 1.5}))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == KeyDeriver("fn", "[customerId, orderId]").key({"customerId": "c", "orderId": "o"})
    assert other == "fn#" + hashlib.sha256(b'["c","o"]').hexdigest()


def test_multi_field_keys():
    keys = KeyDeriver("fn", "[customerId, orderId]")
    assert keys.key({"customerId": "c", "orderId": "1"}) != keys.key({"customerId": "c", "orderId": "2"})
    assert keys.key({"customerId": "c"}) is not None  # partly present is still a key
    assert keys.key({}) is None  # all fields missing is no key


@pytest.mark.parametrize("event", [{}, {"orderId": None}, {"orderId": ""}, {"orderId": []}, {"orderId": {}}])
def test_empty_selections_give_no_key(event):
    assert KeyDeriver("fn", "orderId").key(event) is None


@pytest.mark.parametrize("value", [0, False, "0", [0]])
def test_falsy_but_real_values_are_keys(value):
    assert KeyDeriver("fn", "orderId").key({"orderId": value}) is not None


def test_json_parse_into_string_body_with_powertools_alias():
    event = {"body": json.dumps({"orderId": "o-9", "n": 1})}
    plain = KeyDeriver("fn", "json_parse(body).orderId").key(event)
    alias = KeyDeriver("fn", "powertools_json(body).orderId").key(event)
    assert plain == alias == "fn#" + hashlib.sha256(b'"o-9"').hexdigest()


def test_base64_and_gzip_functions():
    raw = json.dumps({"id": 7}).encode()
    event = {"b64": base64.b64encode(raw).decode(), "gz": base64.b64encode(gzip.compress(raw)).decode()}
    expected = "fn#" + hashlib.sha256(b"7").hexdigest()
    assert KeyDeriver("fn", "json_parse(base64_decode(b64)).id").key(event) == expected
    assert KeyDeriver("fn", "powertools_json(powertools_base64(b64)).id").key(event) == expected
    assert KeyDeriver("fn", "json_parse(base64_gzip_decode(gz)).id").key(event) == expected
    assert KeyDeriver("fn", "powertools_json(powertools_base64_gzip(gz)).id").key(event) == expected


def test_bad_expression_is_a_configuration_error():
    with pytest.raises(IdempotencyConfigurationError, match=r"IDEMPOTENCY_KEY_JMESPATH='orders\[' is not a valid"):
        KeyDeriver("fn", "orders[")


def test_body_that_is_not_json_is_a_key_error():
    with pytest.raises(IdempotencyKeyError, match="could not be applied"):
        KeyDeriver("fn", "json_parse(body).orderId").key({"body": "not json"})


@pytest.mark.parametrize("expression", ["json_parse(body).orderId", "powertools_json(body).orderId",
                                        "json_parse(base64_decode(body)).id", "base64_gzip_decode(body)"])
def test_missing_body_selects_nothing(expression):
    assert KeyDeriver("fn", expression).key({"httpMethod": "GET"}) is None


def test_integers_beyond_64_bits_are_keys():
    keys = KeyDeriver("fn", "orderId")
    big = keys.key({"orderId": 123456789012345678901234})
    assert big == "fn#" + hashlib.sha256(b"123456789012345678901234").hexdigest()
    assert big != keys.key({"orderId": 123456789012345678901235})


def test_json_parse_keeps_big_integers_apart():
    keys = KeyDeriver("fn", "json_parse(body).orderId")
    first = keys.key({"body": '{"orderId": 12345678901234567890123}'})
    second = keys.key({"body": '{"orderId": 12345678901234567890124}'})
    assert first != second
    assert first == "fn#" + hashlib.sha256(b"12345678901234567890123").hexdigest()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_not_null(value):
    keys = KeyDeriver("fn", None)
    assert keys.key({"a": value}) != keys.key({"a": None})
    assert keys.key([value, None]) != keys.key([None, None])


def test_json_parse_of_non_finite_numbers_keys_them_apart():
    keys = KeyDeriver("fn", "json_parse(body)")
    bodies = ['{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": null}', '{"a": 1e400}']
    assert len({keys.key({"body": b}) for b in bodies[:4]}) == 4
    assert keys.key({"body": bodies[4]}) == keys.key({"body": bodies[1]})  # json.loads reads both as inf


# mtime=0: the same test id in every process (pytest-xdist's workers must collect the same tests)
@pytest.mark.parametrize("data", [base64.b64encode(b"plain text").decode(),
                                  base64.b64encode(gzip.compress(b'{"a": 1}', mtime=0)[:-6]).decode(),
                                  base64.b64encode(b"\x1f\x8b").decode()])
def test_base64_gzip_decode_of_what_is_not_gzip_is_a_key_error(data):
    with pytest.raises(IdempotencyKeyError, match="not gzip data"):
        KeyDeriver("fn", "base64_gzip_decode(b)").key({"b": data})


@pytest.mark.parametrize("expression", ["powertools_jsno(body)", "json_parse(body, body)", "length()",
                                        "[a, nope(b)]"])
def test_unknown_functions_and_wrong_arity_fail_at_init(expression):
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_KEY_JMESPATH"):
        KeyDeriver("fn", expression)


def test_key_errors_name_no_event_content():
    secret = "4111-SECRET-CARD"
    cases = [("json_parse(b)", {"b": {"card": secret}}), ("json_parse(b)", {"b": secret}),
             ("base64_decode(b)", {"b": base64.b64encode(b"\xff" + secret.encode()).decode()}),
             ("base64_gzip_decode(b)", {"b": base64.b64encode(secret.encode()).decode()}),
             ("abs(b)", {"b": secret}), ("sort(b)", {"b": [1, secret]})]
    for expression, event in cases:
        with pytest.raises(IdempotencyKeyError) as caught:
            KeyDeriver("fn", expression).key(event)
        assert secret not in str(caught.value)
        assert "\\xff" not in str(caught.value)


# -- properties -------------------------------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("IDEMLAYER_PROPERTY_EXAMPLES", "60"))
_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-(2**300), 2**300), st.floats(),
              st.text(max_size=8), st.sampled_from([-0.0, 0.0, 1, 1.0, "\ud800", "\x00", float("nan")])),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=5), children,
                                                                                max_size=4)),
    max_leaves=20,
)


def _json_form(value):
    return json.dumps(value, sort_keys=True)


@settings(max_examples=EXAMPLES * 3, deadline=None, derandomize=True)
@given(a=_json_values, b=_json_values)
def test_values_json_tells_apart_get_different_keys(a, b):
    keys = KeyDeriver("fn", None)
    if _json_form(a) != _json_form(b):
        assert keys.key([a]) != keys.key([b])
    else:
        assert keys.key([a]) == keys.key([b])


@settings(max_examples=EXAMPLES * 3, deadline=None, derandomize=True)
@given(value=_json_values)
def test_json_parse_keys_what_json_loads_reads(value):
    """A body holding a value keys as the value itself would: json_parse reads it as json.loads does."""
    body = json.dumps(value)
    parsed = KeyDeriver("fn", "json_parse(body)").key({"body": body})
    direct = KeyDeriver("fn", "v").key({"v": json.loads(body)})
    assert parsed == direct


_bodies = st.one_of(
    st.text(max_size=30), _json_values.map(json.dumps),
    st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode()),
    st.binary(max_size=30).map(lambda b: base64.b64encode(gzip.compress(b)).decode()),
    st.binary(max_size=30).map(lambda b: base64.b64encode(gzip.compress(b)[:-3]).decode()),
    _json_values,
)
_expressions = st.sampled_from([
    "json_parse(body)", "json_parse(body).a", "base64_decode(body)", "base64_gzip_decode(body)",
    "json_parse(base64_decode(body))", "json_parse(base64_gzip_decode(body)).a", "[body, a]", "body.a.b",
    "length(body)", "keys(body)", "sort(body)", "to_number(body)", "abs(body)", "body[0]", "body[?a > `1`]",
])


@settings(max_examples=EXAMPLES * 5, deadline=None, derandomize=True)
@given(expression=_expressions, body=_bodies, extra=_json_values)
def test_key_derivation_raises_only_key_errors(expression, body, extra):
    keys = KeyDeriver("fn", expression)
    for event in ({"body": body, "a": extra}, {"body": {"a": body}}, [body], body):
        try:
            key = keys.key(event)
        except IdempotencyKeyError:
            continue
        assert key is None or key.startswith("fn#")


@pytest.mark.parametrize("expression", ["merge()", "not_null()", "'orderId'", "`1`", '`"orderId"`'])
def test_expressions_that_fail_or_read_nothing_fail_at_init(expression):
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_KEY_JMESPATH"):
        KeyDeriver("fn", expression)


@pytest.mark.parametrize("expression", ["merge(a)", "not_null(a, b)", "length(@) > `0`", "*.a", "[a, `1`]"])
def test_expressions_that_read_the_event_are_accepted(expression):
    assert KeyDeriver("fn", expression).expression == expression


@pytest.mark.parametrize("expression", ["body[", "nope(body)", "'constant'"])
def test_a_bad_payload_expression_fails_init_naming_its_variable(expression):
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_PAYLOAD_JMESPATH="):
        KeyDeriver("fn", "orderId", expression)


def test_fingerprints_are_sha256_of_the_selection_and_none_without_the_setting():
    keys = KeyDeriver("fn", "orderId", "json_parse(body)")
    event = {"orderId": "1", "body": '{"b": 2, "a": 1}'}
    tag = hashlib.sha256(b"json_parse(body)").hexdigest()[:16]  # which expression made it
    assert keys.fingerprint(event) == hashlib.sha256(b'{"a":1,"b":2}').hexdigest() + "." + tag
    assert keys.fingerprint({"orderId": "1"}) == hashlib.sha256(b"null").hexdigest() + "." + tag  # null too
    assert KeyDeriver("fn", "orderId", "body").fingerprint(event).partition(".")[2] != tag
    assert KeyDeriver("fn", "orderId").fingerprint(event) is None
    with pytest.raises(IdempotencyKeyError, match="IDEMPOTENCY_PAYLOAD_JMESPATH='json_parse\\(body\\)' could not"):
        keys.fingerprint({"orderId": "1", "body": "not json"})


# A bare field is read without jmespath (keys._field): it must select exactly what jmespath selects.
_names = st.one_of(st.sampled_from(["orderId", "id", "_x", "true", "null", "a1"]),
                   st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True))
_events = st.one_of(
    _json_values,
    st.dictionaries(st.one_of(_names, st.text(max_size=4)), _json_values, max_size=5),
)


@settings(max_examples=EXAMPLES * 3, deadline=None)
@given(name=_names, event=_events, present=_json_values)
def test_a_bare_field_selects_what_jmespath_selects(name, event, present):
    import jmespath

    deriver = KeyDeriver("p", name)
    for value in (event, {**event, name: present} if isinstance(event, dict) else [event]):
        assert deriver.select(value) is jmespath.search(name, value)  # the very value, or None alike
        assert deriver.key(value) == deriver.key_of(jmespath.search(name, value))


def test_a_bare_field_is_read_without_importing_jmespath():
    import subprocess
    import sys

    code = ("import sys; from idempotency_layer.keys import KeyDeriver; k = KeyDeriver('p', 'orderId'); "
            "assert k.key({'orderId': 1}) and 'jmespath' not in sys.modules; "
            "KeyDeriver('p', 'a.b'); assert 'jmespath' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
