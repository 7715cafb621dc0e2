"""Fixtures on real components: DynamoDB Local (or LocalStack when LOCALSTACK_HOST is set)."""

from __future__ import annotations

import itertools
import os

import pytest
from localstack_client.session import Session

from tests.support.dynamodb_local import DynamoDBLocal, create_table

_names = itertools.count()
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
               "AWS_DEFAULT_REGION": "us-east-1"}


class _LocalStack:
    def __init__(self) -> None:
        host = os.environ["LOCALSTACK_HOST"]
        self.endpoint = host if "://" in host else f"http://{host if ':' in host else host + ':4566'}"

    def stop(self) -> None: ...

    def start(self) -> _LocalStack:
        return self


@pytest.fixture(scope="session")
def dynamodb(tmp_path_factory):
    if os.environ.get("LOCALSTACK_HOST"):
        yield _LocalStack()
        return
    server = DynamoDBLocal(tmp_path_factory.mktemp("dynamodb") / "dynamodb.log").start()
    yield server
    server.stop()


def _session(endpoint: str) -> Session:
    # localstack-client takes host:port, so DynamoDB Local on its own port is a LocalStack to it.
    return Session(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1",
                   localstack_host=endpoint.split("://", 1)[1])


@pytest.fixture(scope="session")
def ddb_client(dynamodb):
    return _session(dynamodb.endpoint).client("dynamodb")


@pytest.fixture
def table(ddb_client):
    name = create_table(ddb_client, f"idempotency-{os.getpid()}-{next(_names)}")
    yield name
    ddb_client.delete_table(TableName=name)


@pytest.fixture
def layer_env(dynamodb, monkeypatch):
    """What the layer needs to reach the test table: credentials, region and the endpoint."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", dynamodb.endpoint)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return dynamodb
