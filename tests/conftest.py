"""Fixtures on real components: DynamoDB Local (or LocalStack when LOCALSTACK_HOST is set)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest
from localstack_client import config as localstack_config
from localstack_client.session import Session

from tests.support.dynamodb_local import DynamoDBLocal, create_table
from tests.support.sqs_server import SQSServer

_names = itertools.count()
# The transports the DynamoDB suites run on, named as IDEMPOTENCY_TRANSPORT and the sources name them: `lean`
# with its target from the environment alone (the plain Lambda case, no botocore), `lean-botocore` (the same
# client, its target from botocore: every other environment) and `boto3`.
TRANSPORTS = ("lean", "lean-botocore", "boto3")


def build_transport(kind: str, **options: Any) -> Any:
    """A transport of one of TRANSPORTS, from the environment as the interceptor builds it."""
    from idempotency_layer.stores.dynamodb import make_transport

    if kind == "lean":
        return make_transport("lean", source="environment", **options)
    if kind == "lean-botocore":
        return make_transport("lean", source="botocore", **options)
    return make_transport(kind, **options)
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
               "AWS_DEFAULT_REGION": "us-east-1"}


class _LocalStack:
    """A LocalStack someone else runs; its endpoint is what localstack-client resolves from LOCALSTACK_HOST."""

    running = True

    def __init__(self) -> None:
        self.endpoint = localstack_config.get_service_endpoints()["dynamodb"]

    def stop(self) -> None:
        raise NotImplementedError("a LocalStack the tests did not start cannot be stopped by them")

    def start(self) -> _LocalStack:
        return self


@pytest.fixture(scope="session")
def dynamodb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DynamoDBLocal | _LocalStack]:
    if os.environ.get("LOCALSTACK_HOST"):
        yield _LocalStack()
        return
    server = DynamoDBLocal(tmp_path_factory.mktemp("dynamodb") / "dynamodb.log").start()
    try:
        yield server
    finally:
        server.stop()


def ddb_session(endpoint: str) -> Session:
    """A localstack-client session on `endpoint`.

    localstack-client takes a host:port (`localstack_host`, else $LOCALSTACK_HOST), so DynamoDB Local on its
    own port is just a LocalStack to it; no environment variable needs changing.
    """
    return Session(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1",
                   localstack_host=endpoint.split("://", 1)[1])


@pytest.fixture(scope="session")
def ddb_client(dynamodb: DynamoDBLocal | _LocalStack) -> Any:
    return ddb_session(dynamodb.endpoint).client("dynamodb")


@pytest.fixture
def table(ddb_client: Any) -> Iterator[str]:
    """A fresh table per test (cheap in -inMemory), so no test sees another's records."""
    name = create_table(ddb_client, f"idempotency-{os.getpid()}-{next(_names)}")
    yield name
    ddb_client.delete_table(TableName=name)


@pytest.fixture
def layer_env(dynamodb: DynamoDBLocal | _LocalStack, monkeypatch: pytest.MonkeyPatch) -> DynamoDBLocal | _LocalStack:
    """What the layer needs to reach the test table: credentials, region and the endpoint."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", dynamodb.endpoint)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    return dynamodb


# moto's server on a free loopback port (Lambda, IAM, SQS, Kinesis...), one per test module: no state crosses.
@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SQSServer]:
    server = SQSServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
    try:
        yield server
    finally:
        server.stop()


# Real Valkey 9 and Redis OSS 7 servers (IDEMPOTENCY_STORE=valkey), started once per session (per xdist worker).
@pytest.fixture(scope="session")
def valkey_servers() -> Iterator[dict[str, Any]]:
    from tests.support.valkey_server import KINDS, Server

    servers = {kind: Server(kind).start() for kind in KINDS}
    try:
        yield servers
    finally:
        for server in servers.values():
            server.close()
