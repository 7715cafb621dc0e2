"""Store and cycle fixtures: the layer's transports, pointed through a counting proxy at DynamoDB Local; and the
Valkey store on real Valkey 9 and Redis OSS 7 servers.

Every test that takes `store` runs on each: DynamoDB (per transport), `redis7` and `valkey9`, unless it takes a
fixture of DynamoDB's own too (the table, the proxy, a transport, boto3's client), or its module or the test is
marked `dynamodb_only`: what it checks is DynamoDB's layout or wire, which the other store does not have.
"""

import inspect
from urllib.parse import urlparse

import pytest

from idempotency_layer.config import Attributes
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from tests.conftest import TRANSPORTS, build_transport
from tests.support.counting_proxy import CountingProxy
from tests.support.dynamodb_local import create_table
from tests.support.valkey_server import KINDS as VALKEY_KINDS

# A test taking one of these checks DynamoDB itself.
_DYNAMODB_FIXTURES = {"transport", "ddb_client", "proxy", "table_name", "table", "sort_key_table", "dynamodb"}


def pytest_generate_tests(metafunc):
    given = any("transport" in marker.args[0] for marker in metafunc.definition.iter_markers("parametrize"))
    if "store" not in metafunc.fixturenames or hasattr(metafunc.module, "store"):  # (a module's own store fixture)
        if "transport" in metafunc.fixturenames and not given:
            metafunc.parametrize("transport", TRANSPORTS, indirect=True)
        return
    own = set(inspect.signature(metafunc.function).parameters)
    marked = metafunc.definition.get_closest_marker("dynamodb_only") is not None
    combos = [(transport, "dynamodb") for transport in TRANSPORTS]
    if not (own & _DYNAMODB_FIXTURES or marked):
        combos += [("lean", kind) for kind in VALKEY_KINDS]
    ids = [transport if backend == "dynamodb" else backend for transport, backend in combos]
    metafunc.parametrize(("transport", "backend"), combos, indirect=True, ids=ids)


@pytest.fixture
def backend(request):
    return getattr(request, "param", "dynamodb")


def valkey_store(server):
    """The layer's Valkey store on `server`, emptied first."""
    from idempotency_layer.config import Valkey
    from idempotency_layer.stores.valkey.client import Client
    from idempotency_layer.stores.valkey.store import ValkeyStore

    server.command("FLUSHALL")
    client = Client(Valkey(tls=False, host="127.0.0.1", port=server.port, db=0, username=None, password=None),
                    connect_timeout=2, read_timeout=5, max_attempts=2)
    return ValkeyStore(client)


@pytest.fixture(scope="session")
def proxy(dynamodb):
    upstream = urlparse(dynamodb.endpoint)
    counting = CountingProxy(upstream.hostname, upstream.port)
    yield counting
    counting.close()


@pytest.fixture
def table_name(table):
    return getattr(table, "name", table)


@pytest.fixture  # parametrised over TRANSPORTS by pytest_generate_tests
def transport(request, layer_env, proxy, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint)
    return build_transport(request.param, connect_timeout=2, read_timeout=5, max_attempts=2)


@pytest.fixture
def store(request, backend, transport):  # (a transport in every case: the parametrisation names one)
    if backend != "dynamodb":
        store = valkey_store(request.getfixturevalue("valkey_servers")[backend])
        yield store
        store.client.close()
        return
    table_name, proxy = request.getfixturevalue("table_name"), request.getfixturevalue("proxy")
    proxy.reset()
    yield DynamoDBStore(transport, table_name, Attributes(), key_prefix="fn")


@pytest.fixture
def sort_key_table(ddb_client, request):
    name = f"sk-{abs(hash(request.node.nodeid))}"
    create_table(ddb_client, name, key_attr="pk", sort_key_attr="sk")
    yield name
    ddb_client.delete_table(TableName=name)


@pytest.fixture
def s3_bucket(moto):
    """A new bucket on the module's moto S3 server, and a boto3 client of it: (name, client)."""
    import time

    import boto3

    client = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1", aws_access_key_id="a",
                          aws_secret_access_key="b")
    name = f"results-{time.time_ns()}"
    client.create_bucket(Bucket=name)
    return name, client
