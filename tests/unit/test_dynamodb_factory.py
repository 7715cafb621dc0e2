"""dynamodb.make_transport: which transport and which source it builds, the arguments it refuses, and that the
plain Lambda environment imports no botocore at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from idempotency_layer.stores.dynamodb import make_transport
from idempotency_layer.stores.dynamodb.boto3_client import Boto3Transport
from idempotency_layer.stores.dynamodb.client import Client
from tests.support.scripted_dynamodb import OPTIONS

LAYER = Path(__file__).resolve().parents[2] / "layer"


def test_make_transport_checks_its_arguments(aws_env):
    with pytest.raises(ValueError, match="unknown transport"):
        make_transport("http2", **OPTIONS)
    with pytest.raises(ValueError, match="max_attempts"):
        make_transport("lean", **{**OPTIONS, "max_attempts": 0})
    with pytest.raises(ValueError, match="unknown source"):
        make_transport("lean", source="urllib3", **OPTIONS)


def test_make_transport_picks_the_source(aws_env):
    plain = make_transport("lean", **OPTIONS)
    assert isinstance(plain, Client) and plain.target.source == "environment"
    forced = make_transport("lean", source="botocore", **OPTIONS)
    assert isinstance(forced, Client) and forced.target.source == "botocore"
    assert forced.endpoint == plain.endpoint == "https://dynamodb.eu-west-1.amazonaws.com"
    aws_env.setenv("AWS_USE_FIPS_ENDPOINT", "true")
    fips = make_transport("lean", **OPTIONS)
    assert fips.target.source == "botocore" and fips.endpoint == "https://dynamodb-fips.eu-west-1.amazonaws.com"
    with pytest.raises(ValueError, match="plain Lambda"):  # the environment source cannot serve it
        make_transport("lean", source="environment", **OPTIONS)
    assert isinstance(make_transport("boto3", **OPTIONS), Boto3Transport)


def test_the_options_reach_the_transport(aws_env):
    t = make_transport("lean", **{**OPTIONS, "max_attempts": 4})
    assert t.retry.max_attempts == 4
    t = make_transport("boto3", connect_timeout=2, read_timeout=3, max_attempts=4)
    config = t.client.meta.config
    assert (config.connect_timeout, config.read_timeout, config.retries["total_max_attempts"]) == (2, 3, 4)


_IMPORTS = (
    "import sys; from idempotency_layer.stores.dynamodb import make_transport; "
    "t = make_transport('lean', connect_timeout=1, read_timeout=1, max_attempts=1); "
    "print(t.target.source); print(' '.join(sorted(sys.modules)))"
)


def imported(tmp_path, **env) -> tuple[str, set[str]]:
    """(the source make_transport picked, the top-level packages of botocore's family imported) in a fresh
    interpreter on the given environment."""
    environ = {"PATH": os.environ["PATH"], "PYTHONPATH": str(LAYER), "HOME": str(tmp_path), **env}
    run = subprocess.run([sys.executable, "-c", _IMPORTS], env=environ, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    source, modules = run.stdout.splitlines()
    return source, {m.split(".")[0] for m in modules.split()} & {"botocore", "boto3", "urllib3", "s3transfer"}


LAMBDA = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t",
          "AWS_REGION": "eu-west-1"}


def test_the_plain_lambda_environment_imports_no_botocore(tmp_path):
    assert imported(tmp_path, **LAMBDA, AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:9") == ("environment", set())
    assert imported(tmp_path, **LAMBDA) == ("environment", set())  # https, the CA bundle found without botocore
    # The check above can fail: another environment does import botocore.
    source, family = imported(tmp_path, **LAMBDA, AWS_USE_FIPS_ENDPOINT="true")
    assert source == "botocore" and "botocore" in family
