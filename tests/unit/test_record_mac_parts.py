"""Record authentication's pure parts (record_mac, IDEMPOTENCY_RECORD_MAC_KEY's parsing): the canonical encoding,
key ids, sealing and checking; the store runs are tests/store/test_record_mac.py."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer import codec
from idempotency_layer import config as _config
from idempotency_layer.errors import IdempotencyConfigurationError, IdempotencyPersistenceLayerError
from idempotency_layer.record_mac import MIN_KEY_BYTES, RecordMac, canonical, key_id
from idempotency_layer.stores.protocol import COMPLETED, Record

OLD, NEW = b"o" * 32, bytes(range(40))
STORE = "store:orders"
VALUES = st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63), st.text(max_size=12),
                   st.binary(max_size=12))


@settings(max_examples=50, deadline=None)
@given(st.lists(VALUES, max_size=6), st.lists(VALUES, max_size=6))
def test_distinct_tuples_have_distinct_encodings(a, b):
    # Types count: 1, "1" and b"1" differ, and so do None and "".
    same = len(a) == len(b) and all(type(x) is type(y) and x == y for x, y in zip(a, b, strict=True))
    assert (canonical(*a) == canonical(*b)) == same


@pytest.mark.parametrize(("a", "b"), [(("ab", "c"), ("a", "bc")), ((None,), ("",)), ((1,), ("1",)),
                                      (("x",), (b"x",)), ((), (None,))])
def test_the_encodings_that_naive_joins_confuse_differ(a, b):
    assert canonical(*a) != canonical(*b)


def test_a_key_id_is_8_hex_characters_of_the_key_and_nothing_else():
    assert key_id(NEW) == key_id(bytes(NEW)) and len(key_id(NEW)) == 8
    assert int(key_id(NEW), 16) >= 0 and key_id(NEW) != key_id(OLD)


def record(mac: RecordMac, key: str = "fn#k1", data: str | bytes | None = '{"ok":true}',
           fingerprint: str | None = "fp", **changes) -> Record:
    result = codec.Encoded("json", data)
    fields = {"key": key, "status": COMPLETED, "expires_at": 2_000_000_000, "in_progress_until": 5, "owner": "o-1",
              "result": result, "fingerprint": fingerprint,
              "mac": mac.seal(key, 2_000_000_000, "o-1", result, fingerprint)}
    fields.update(changes)
    return Record(**fields)


def test_a_sealed_record_passes_and_any_change_to_what_it_covers_fails():
    mac = RecordMac([NEW], STORE)
    good = record(mac)
    assert mac.fault(good) is None
    assert mac.fault(good._replace(result=codec.Encoded("json", '{"ok":false}'))) == "its mac does not match"
    for change in ({"key": "fn#k2"}, {"expires_at": 2_000_000_001}, {"owner": "o-2"}, {"fingerprint": None},
                   {"result": codec.Encoded("tagged", '{"ok":true}')}, {"result": None}):
        assert mac.fault(good._replace(**change)) == "its mac does not match", change
    # What it does not cover: the claim's time, which a completed record has no use for.
    assert mac.fault(good._replace(in_progress_until=9)) is None
    assert RecordMac([NEW], "store:other").fault(good) == "its mac does not match"  # another store


def test_one_bit_of_the_result_flipped_fails():
    mac = RecordMac([NEW], STORE)
    data = bytearray(b'{"amount":500}')
    good = record(mac, data=bytes(data))
    data[3] ^= 1
    assert mac.fault(good._replace(result=codec.Encoded("json", bytes(data)))) == "its mac does not match"


def test_text_and_its_bytes_seal_alike():
    # A store may hand the result back as text or as bytes, by its format.
    mac = RecordMac([NEW], STORE)
    assert mac.fault(record(mac, data="é")._replace(result=codec.Encoded("json", "é".encode()))) is None


def test_missing_malformed_and_unknown_macs_are_refused_with_their_reason():
    mac = RecordMac([NEW], STORE)
    good = record(mac)
    assert mac.fault(good._replace(mac=None)) == "it has no mac"
    assert mac.fault(good._replace(mac="")) == "it has no mac"
    assert mac.fault(good._replace(mac=f"{key_id(NEW)}:not base64!")) == "its mac is malformed"
    assert mac.fault(good._replace(mac="deadbeef:" + base64.b64encode(b"x" * 32).decode())) == (
        "its key id 'deadbeef' is not configured")


def test_rotation_accepts_the_previous_key_while_configured_and_seals_with_the_current():
    before = RecordMac([OLD], STORE)
    during = RecordMac([NEW, OLD], STORE)
    after = RecordMac([NEW], STORE)
    old = record(before)
    assert old.mac.startswith(key_id(OLD) + ":")
    assert during.fault(old) is None
    assert after.fault(old) == f"its key id {key_id(OLD)!r} is not configured"
    assert record(during).mac.startswith(key_id(NEW) + ":") and after.fault(record(during)) is None


def test_check_raises_the_permanent_integrity_error_naming_the_key_only():
    mac = RecordMac([NEW], STORE)
    forged = record(mac, data='{"refund_to":"attacker-iban"}')._replace(mac=None)
    with pytest.raises(IdempotencyPersistenceLayerError) as raised:
        mac.check(forged)
    error = raised.value
    assert error.permanent and error.integrity and not error.uncertain
    assert "fn#k1" in str(error) and "IDEMPOTENCY_RECORD_MAC_KEY" in str(error) and "attacker" not in str(error)


def test_short_or_repeated_keys_are_refused_naming_the_entry_never_the_value():
    with pytest.raises(IdempotencyConfigurationError) as raised:
        RecordMac([NEW, b"secret-but-short"], STORE)
    said = str(raised.value)
    assert "IDEMPOTENCY_RECORD_MAC_KEY" in said and "entry 2" in said and f"at least {MIN_KEY_BYTES}" in said
    assert "secret-but-short" not in said
    with pytest.raises(IdempotencyConfigurationError, match="same key"):
        RecordMac([NEW, NEW], STORE)


BASE = {"IDEMPOTENCY_TABLE": "orders-idem", "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler",
        "AWS_LAMBDA_FUNCTION_NAME": "fn"}


def test_the_setting_is_a_comma_list_of_sources_current_first():
    env = {**BASE, "IDEMPOTENCY_RECORD_MAC_KEY": "secretsmanager:mac-2, ssm:/fn/mac-1,env:OLD_KEY"}
    assert _config.load(env).record_mac_sources == ("secretsmanager:mac-2", "ssm:/fn/mac-1", "env:OLD_KEY")
    assert _config.load(BASE).record_mac_sources == ()


@pytest.mark.parametrize("value", ["s3:bucket/key", "env:", "hunter2hunter2hunter2hunter2hunter2", "env:A,,env:B"])
def test_a_source_that_is_not_one_is_refused_naming_the_entry_never_the_value(value):
    with pytest.raises(IdempotencyConfigurationError) as raised:
        _config.load({**BASE, "IDEMPOTENCY_RECORD_MAC_KEY": value})
    said = str(raised.value)
    assert said.startswith("IDEMPOTENCY_RECORD_MAC_KEY: entry ") and "hunter2" not in said and "bucket" not in said


def test_a_source_named_twice_is_refused():
    with pytest.raises(IdempotencyConfigurationError, match="twice"):
        _config.load({**BASE, "IDEMPOTENCY_RECORD_MAC_KEY": "env:A,env:A"})


def test_the_powertools_migration_is_refused_with_the_mac_on():
    env = {**BASE, "IDEMPOTENCY_RECORD_MAC_KEY": "env:K", "IDEMPOTENCY_POWERTOOLS_HANDLER": "app.handler"}
    with pytest.raises(IdempotencyConfigurationError, match="Powertools' records carry no MAC"):
        _config.load(env)


def test_an_attribute_named_mac_is_refused_with_the_mac_on():
    env = {**BASE, "IDEMPOTENCY_RECORD_MAC_KEY": "env:K", "IDEMPOTENCY_RESULT_ATTR": "mac"}
    with pytest.raises(IdempotencyConfigurationError, match="attribute 'mac'"):
        _config.load(env)
    assert _config.load({**BASE, "IDEMPOTENCY_RESULT_ATTR": "mac"}).attributes.result == "mac"
