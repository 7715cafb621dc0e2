"""Store errors that need no server: a transport failing outside botocore's error types."""

import logging

import pytest

from idempotency_layer.config import Attributes
from idempotency_layer.errors import IdempotencyPersistenceLayerError
from idempotency_layer.stores.dynamodb.store import DynamoDBStore


class BrokenCredentials:
    def call(self, operation, params, deadline=None):
        raise RuntimeError("Credentials were refreshed, but the refreshed credentials are still expired.")


def test_unexpected_transport_error_becomes_a_persistence_error():
    store = DynamoDBStore(BrokenCredentials(), "orders", Attributes(), key_prefix="fn")
    with pytest.raises(IdempotencyPersistenceLayerError) as caught:
        store.claim("fn#k", "me", 1.0, 1000, 3600)
    assert "PutItem" in str(caught.value) and "'orders'" in str(caught.value) and "RuntimeError" in str(caught.value)


class Unreachable:
    """Every request fails as a TLS handshake against an untrusted certificate fails, or with text of its own."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def call(self, operation, params, deadline=None):
        raise self.error


class Lines(logging.Handler):
    """What the layer's logger writes, however an earlier test set the logger up (it may not propagate)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.text += record.getMessage() + "\n"


@pytest.fixture
def lines():
    logger = logging.getLogger("idempotency_layer")
    handler, level = Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_table_the_init_check_could_not_reach_says_why_when_a_claim_is_refused(lines):
    # A second hostile round saw only "could not be reached" for a bad CA bundle, a refused proxy, bad
    # credentials: nothing said which.
    from idempotency_layer.stores.dynamodb import DynamoDBError

    tls = DynamoDBError("GetItem", "SSLError", "SSL validation failed for https://ddb/ certificate verify failed")
    store = DynamoDBStore(Unreachable(tls), "orders", Attributes(), key_prefix="fn")
    store.verify()
    assert "SSLError: SSL validation failed" in lines.text  # logged at init too
    with pytest.raises(IdempotencyPersistenceLayerError) as caught:
        store.claim("fn#k", "me", 1.0, 1000, 3600)
    assert "could not be reached" in str(caught.value) and "SSLError: SSL validation failed" in str(caught.value)
    # An error outside DynamoDB's error model is named by its type alone: its text may say anything.
    other = DynamoDBStore(Unreachable(ValueError("SECRET-TEXT")), "orders", Attributes(), key_prefix="fn")
    other.verify()
    with pytest.raises(IdempotencyPersistenceLayerError) as caught:
        other.claim("fn#k", "me", 1.0, 1000, 3600)
    assert "(ValueError)" in str(caught.value) and "SECRET" not in str(caught.value) + lines.text
