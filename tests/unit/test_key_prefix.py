"""The key prefix (issue 44, R1.1 and R1.2): the table check reads under the function's own prefix, so a role confined
to `<prefix>#*` passes init, and a prefix IAM, Valkey ACLs and S3 cannot read unambiguously fails init."""

from __future__ import annotations

import pytest

from idempotency_layer import config
from idempotency_layer.config import Attributes
from idempotency_layer.errors import IdempotencyConfigurationError
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from tests.support.leading_keys import LeadingKeys
from tests.support.memory_dynamodb import MemoryDynamoDB, MemoryTransport


def test_the_table_check_reads_under_the_prefix_in_the_partition_key_layout():
    policy = LeadingKeys(MemoryTransport(MemoryDynamoDB()), ["orders#*"])
    DynamoDBStore(policy, "shared", Attributes(), key_prefix="orders").verify()
    assert policy.seen == [("GetItem", "orders#idempotency-layer-schema-check", True)]


def test_the_table_check_reads_the_partition_value_in_the_sort_key_layout():
    db = MemoryDynamoDB("pk", "sk")
    sent: list[dict] = []

    class Recording(MemoryTransport):
        def call(self, operation, params, deadline=None):
            sent.append(params["Key"])
            return super().call(operation, params, deadline)

    policy = LeadingKeys(Recording(db), ["idempotency#orders"], key_attr="pk")
    DynamoDBStore(policy, "shared", Attributes(key="pk", sort_key="sk"), "idempotency#orders",
                  key_prefix="orders").verify()
    assert policy.denied == []
    assert sent == [{"pk": {"S": "idempotency#orders"}, "sk": {"S": "orders#idempotency-layer-schema-check"}}]


def test_no_two_prefixes_share_a_table_check_key():
    one, other = (DynamoDBStore(MemoryTransport(MemoryDynamoDB()), "t", Attributes(), key_prefix=prefix).check_key
                  for prefix in ("orders", "payments"))
    assert one != other and one.startswith("orders#") and other.startswith("payments#")


def test_a_role_confined_to_another_prefix_fails_the_table_check():
    policy = LeadingKeys(MemoryTransport(MemoryDynamoDB()), ["payments#*"])
    with pytest.raises(IdempotencyConfigurationError, match=r"may not read the table.*key .orders#idempotency-layer-"):
        DynamoDBStore(policy, "shared", Attributes(), key_prefix="orders").verify()
    assert [seen.key for seen in policy.denied] == ["orders#idempotency-layer-schema-check"]


# Each character R1.2 names, and the lengths: `#` (a#b#... keys would match function a's a#*), IAM's and Valkey's
# wildcards, cluster hash tags, `.` (Powertools' fn.handler# keys), whitespace inside the value, non-ASCII, a bidi
# override, 65 characters.
BAD_PREFIXES = ["orders#evil", "or*ders", "orders?", "orders[1]", "[orders", "{orders}", "orders{", "orders}",
                "orders.v2", "or ders", "orders\tx", "orders\nx", "ordérs", "orders\u202e", "o" * 65]
BASE = {"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "IDEMPOTENCY_TABLE": "shared"}


@pytest.mark.parametrize("prefix", BAD_PREFIXES)
def test_a_key_prefix_outside_the_function_name_alphabet_fails_init(prefix):
    with pytest.raises(IdempotencyConfigurationError) as caught:
        config.load({**BASE, "AWS_LAMBDA_FUNCTION_NAME": "orders", "IDEMPOTENCY_KEY_PREFIX": prefix})
    said = str(caught.value)
    assert said.startswith("IDEMPOTENCY_KEY_PREFIX=") and "1 to 64 of A-Z a-z 0-9 _ -" in said
    assert said.isascii() and said.isprintable()  # no control or bidi character shown raw


@pytest.mark.parametrize("prefix", BAD_PREFIXES)
def test_a_function_name_taken_as_the_prefix_is_checked_too(prefix):
    with pytest.raises(IdempotencyConfigurationError) as caught:
        config.load({**BASE, "AWS_LAMBDA_FUNCTION_NAME": prefix})
    said = str(caught.value)
    assert said.startswith("AWS_LAMBDA_FUNCTION_NAME=") and "set IDEMPOTENCY_KEY_PREFIX" in said
    assert said.isascii() and said.isprintable()


def test_an_empty_prefix_counts_as_unset():
    assert config.load({**BASE, "AWS_LAMBDA_FUNCTION_NAME": "orders", "IDEMPOTENCY_KEY_PREFIX": ""}).key_prefix == (
        "orders")
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_KEY_PREFIX is not set"):
        config.load({**BASE, "IDEMPOTENCY_KEY_PREFIX": ""})


def test_the_bidi_override_is_shown_escaped():
    with pytest.raises(IdempotencyConfigurationError) as caught:
        config.load({**BASE, "IDEMPOTENCY_KEY_PREFIX": "orders\u202e"})
    assert "'orders\\u202e'" in str(caught.value) and "\u202e" not in str(caught.value)


@pytest.mark.parametrize("prefix", ["orders", "Orders_2", "my-function", "a", "A" * 64, "0"])
def test_function_names_are_accepted(prefix):
    assert config.load({**BASE, "IDEMPOTENCY_KEY_PREFIX": prefix}).key_prefix == prefix


@pytest.mark.parametrize("value", ["idempotency#orders*", "idempotency#{orders}", "idempotency#or[d]ers",
                                   "idem?", "idempotency orders", "idempotency.orders", "idempotency#\u202e",
                                   "p" * 129])
def test_a_partition_value_outside_its_alphabet_fails_init(value):
    with pytest.raises(IdempotencyConfigurationError) as caught:
        config.load({**BASE, "IDEMPOTENCY_KEY_PREFIX": "orders", "IDEMPOTENCY_SORT_KEY_ATTR": "sk",
                     "IDEMPOTENCY_PARTITION_VALUE": value})
    said = str(caught.value)
    assert said.startswith("IDEMPOTENCY_PARTITION_VALUE=") and "1 to 128 of A-Z a-z 0-9 _ - #" in said
    assert said.isascii() and said.isprintable()


def test_the_default_partition_value_and_a_set_one_of_the_alphabet_are_accepted():
    sort_key = {**BASE, "IDEMPOTENCY_KEY_PREFIX": "orders", "IDEMPOTENCY_SORT_KEY_ATTR": "sk"}
    assert config.load(sort_key).partition_value == "idempotency#orders"
    assert config.load({**sort_key, "IDEMPOTENCY_PARTITION_VALUE": "tenant_1#orders-v2"}).partition_value == (
        "tenant_1#orders-v2")


@pytest.mark.parametrize("option", ["--key-prefix", "--function-name"])
def test_the_cli_refuses_the_same_prefixes(option):
    import argparse

    from idempotency_layer.cli import settings as cli_settings

    parser = argparse.ArgumentParser()
    cli_settings.add_options(parser)
    for prefix in ("orders.v2", "orders\u202e"):
        env = cli_settings.environment(parser.parse_args([option, prefix, "--table", "shared"]), base={})
        with pytest.raises(IdempotencyConfigurationError, match="1 to 64 of A-Z a-z 0-9 _ -") as caught:
            cli_settings.load(env)
        assert str(caught.value).isascii()
