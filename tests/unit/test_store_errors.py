"""Store errors that need no server: a transport failing outside botocore's error types."""

import pytest

from idempotency_layer.config import Attributes
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.store import DynamoDBStore


class BrokenCredentials:
    def call(self, operation, params, deadline=None):
        raise RuntimeError("Credentials were refreshed, but the refreshed credentials are still expired.")


def test_unexpected_transport_error_becomes_a_persistence_error():
    store = DynamoDBStore(BrokenCredentials(), "orders", Attributes())
    with pytest.raises(IdempotencyPersistenceLayerError) as caught:
        store.claim("fn#k", "me", 1.0, 1000, 3600)
    assert "PutItem" in str(caught.value) and "'orders'" in str(caught.value) and "RuntimeError" in str(caught.value)
