"""The key prefix (issue 44, R1.1 and R1.2): the table check reads under the function's own prefix, so a role confined
to `<prefix>#*` passes init, and a prefix IAM, Valkey ACLs and S3 cannot read unambiguously fails init."""

from __future__ import annotations

import pytest

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
    with pytest.raises(IdempotencyConfigurationError, match="may not read the table"):
        DynamoDBStore(policy, "shared", Attributes(), key_prefix="orders").verify()
    assert [seen.key for seen in policy.denied] == ["orders#idempotency-layer-schema-check"]
