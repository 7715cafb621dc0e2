"""Store and cycle fixtures: the layer's transports, pointed through a counting proxy at DynamoDB Local."""

from urllib.parse import urlparse

import pytest

from idempotency_layer.config import Attributes
from idempotency_layer.store import DynamoDBStore
from tests.conftest import TRANSPORTS, build_transport
from tests.support.counting_proxy import CountingProxy
from tests.support.dynamodb_local import create_table


@pytest.fixture(scope="session")
def proxy(dynamodb):
    upstream = urlparse(dynamodb.endpoint)
    counting = CountingProxy(upstream.hostname, upstream.port)
    yield counting
    counting.close()


@pytest.fixture
def table_name(table):
    return getattr(table, "name", table)


@pytest.fixture(params=TRANSPORTS)
def transport(request, layer_env, proxy, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    return build_transport(request.param, connect_timeout=2, read_timeout=5, max_attempts=2)


@pytest.fixture
def store(transport, table_name, proxy):
    proxy.reset()
    return DynamoDBStore(transport, table_name, Attributes())


@pytest.fixture
def sort_key_table(ddb_client, request):
    name = f"sk-{abs(hash(request.node.nodeid))}"
    create_table(ddb_client, name, key_attr="pk", sort_key_attr="sk")
    yield name
    ddb_client.delete_table(TableName=name)
