"""dynamodb.botocore_source: in every environment but the plain Lambda one, the target (endpoint, region,
credentials, CA bundle, proxy) is what a boto3 DynamoDB client would use there."""

from __future__ import annotations

import os
import sys

import pytest
from botocore.exceptions import NoRegionError
from botocore.httpsession import get_cert_path

from idempotency_layer.stores.dynamodb import make_transport
from idempotency_layer.stores.dynamodb.boto3_client import Boto3Transport
from idempotency_layer.stores.dynamodb.botocore_source import from_botocore
from idempotency_layer.stores.dynamodb.client import Client
from idempotency_layer.stores.dynamodb.environment import plain_lambda
from tests.support.scripted_dynamodb import OPTIONS, answer


class Sent(Exception):
    pass


def boto3_url() -> str:
    """Where a boto3 client in this environment really sends a request (its endpoint rules run per request)."""
    client = Boto3Transport(**OPTIONS).client

    def stop(request, **kwargs):
        raise Sent(request.url)

    client.meta.events.register("before-send", stop)
    with pytest.raises(Sent) as sent:
        client.get_item(TableName="t", Key={"id": {"S": "k"}})
    return sent.value.args[0].rstrip("/")


# -- the endpoint ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "https://dynamodb.eu-west-1.amazonaws.com"),
        ({"AWS_DEFAULT_REGION": "cn-north-1"}, "https://dynamodb.cn-north-1.amazonaws.com.cn"),
        ({"AWS_DEFAULT_REGION": "us-gov-west-1"}, "https://dynamodb.us-gov-west-1.amazonaws.com"),
        ({"AWS_USE_FIPS_ENDPOINT": "true"}, "https://dynamodb-fips.eu-west-1.amazonaws.com"),
        ({"AWS_USE_DUALSTACK_ENDPOINT": "true"}, "https://dynamodb.eu-west-1.api.aws"),
        ({"AWS_ACCOUNT_ID": "123456789012"}, "https://123456789012.ddb.eu-west-1.amazonaws.com"),
        (
            {"AWS_ACCOUNT_ID": "123456789012", "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled"},
            "https://dynamodb.eu-west-1.amazonaws.com",
        ),
        # The template declares it empty so `sam local --env-vars` can set it: empty means unset, for both.
        ({"AWS_ENDPOINT_URL_DYNAMODB": ""}, "https://dynamodb.eu-west-1.amazonaws.com"),
        ({"AWS_ENDPOINT_URL_DYNAMODB": "", "AWS_ENDPOINT_URL": "http://global:1"}, "http://global:1"),
        ({"AWS_ENDPOINT_URL": "http://global:1"}, "http://global:1"),
        ({"AWS_ENDPOINT_URL": "http://global:1", "AWS_ENDPOINT_URL_DYNAMODB": "http://ddb:2"}, "http://ddb:2"),
        (
            {"AWS_ENDPOINT_URL_DYNAMODB": "http://ddb:2", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"},
            "https://dynamodb.eu-west-1.amazonaws.com",
        ),
    ],
)
def test_endpoint_is_the_one_boto3_would_use(aws_env, env, expected):
    for name, value in env.items():
        aws_env.setenv(name, value)
    target = from_botocore()
    assert (target.endpoint, target.source) == (expected, "botocore")
    assert make_transport("lean", source="botocore", **OPTIONS).endpoint == expected
    assert boto3_url() == expected


def test_endpoint_from_the_config_files_services_section(aws_env, tmp_path):
    (tmp_path / "config").write_text(
        "[default]\nservices = local\n\n[services local]\ndynamodb =\n  endpoint_url = http://from-config:9\n"
    )
    assert from_botocore().endpoint == "http://from-config:9"
    assert boto3_url() == "http://from-config:9"
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://env:1")
    assert from_botocore().endpoint == "http://env:1"


def test_a_credentials_file_endpoint_is_honoured(aws_env, tmp_path):
    # The case a hostile review found: botocore takes endpoint_url from ~/.aws/credentials.
    aws_env.setenv("HOME", str(tmp_path))
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        aws_env.delenv(name)
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\nendpoint_url = http://127.0.0.1:9\n")
    t = make_transport("lean", **OPTIONS)  # the default source sees the file and asks botocore
    assert t.endpoint == "http://127.0.0.1:9" and t.target.source == "botocore"


@pytest.mark.parametrize("region", ["us-east-1", "eu-central-2", "ap-southeast-5", "il-central-1", "mx-central-1",
                                    "ca-west-1", "me-south-1", "af-south-1", "sa-east-1", "us-west-2"])
def test_the_plain_paths_regional_endpoint_is_botocores(aws_env, region):
    aws_env.setenv("AWS_DEFAULT_REGION", region)
    ours = plain_lambda(os.environ)
    assert ours is not None and ours.endpoint == from_botocore().endpoint


# -- the region -----------------------------------------------------------------------------------------------


def test_region_from_aws_region_when_botocore_finds_none(aws_env):
    # Lambda sets AWS_REGION; botocore reads only AWS_DEFAULT_REGION and the config file.
    aws_env.delenv("AWS_DEFAULT_REGION")
    aws_env.setenv("AWS_REGION", "ap-south-1")
    target = from_botocore()
    assert (target.region, target.endpoint) == ("ap-south-1", "https://dynamodb.ap-south-1.amazonaws.com")
    assert Boto3Transport(**OPTIONS).region == "ap-south-1"


def test_no_region_fails_at_build_for_both(aws_env):
    aws_env.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(NoRegionError):
        make_transport("lean", **OPTIONS)
    with pytest.raises(NoRegionError):
        make_transport("lean", source="botocore", **OPTIONS)
    with pytest.raises(NoRegionError):
        make_transport("boto3", **OPTIONS)


# -- credentials ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", [{"AWS_SESSION_TOKEN": "s"}, {"AWS_SECURITY_TOKEN": "l", "AWS_SESSION_TOKEN": "s"}])
def test_the_credentials_are_the_ones_the_plain_path_reads(aws_env, tokens):
    for name, value in tokens.items():
        aws_env.setenv(name, value)
    assert from_botocore().credentials() == plain_lambda(os.environ).credentials()


def test_no_credentials_are_none(aws_env):
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    assert from_botocore().credentials() is None


_PROCESS = """
import datetime, json, pathlib, sys
counter = pathlib.Path(sys.argv[1])
n = int(counter.read_text()) + 1 if counter.exists() else 0
counter.write_text(str(n))
# Inside botocore's mandatory refresh window: every use asks for fresh credentials.
expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=60)
print(json.dumps({"Version": 1, "AccessKeyId": f"AKIDREFRESHED{n}", "SecretAccessKey": "s", "SessionToken": "tok",
                  "Expiration": expiry.isoformat()}))
"""


def test_refreshable_credentials_are_frozen_per_request_so_refreshes_take_effect(scripted, aws_env, tmp_path):
    server = scripted(answer())
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    (tmp_path / "refresh.py").write_text(_PROCESS)
    (tmp_path / "config").write_text(
        f"[default]\ncredential_process = {sys.executable} {tmp_path / 'refresh.py'} {tmp_path / 'count'}\n")
    client = Client(from_botocore(), **OPTIONS)
    client.call("GetItem", {})
    client.call("GetItem", {})
    used = [server.headers(i)["authorization"].split("Credential=")[1].split("/")[0] for i in range(2)]
    assert used[0] != used[1] and all(key.startswith("AKIDREFRESHED") for key in used)
    assert server.headers(1)["x-amz-security-token"] == "tok"


# -- proxy, CA bundle, keep-alive -----------------------------------------------------------------------------


def test_the_proxy_is_botocores_reading_of_the_environment(aws_env):
    aws_env.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert from_botocore().proxy == "http://proxy.internal:3128"
    aws_env.setenv("HTTPS_PROXY", "proxy.internal:3128")  # no scheme: botocore reads it as http://
    assert from_botocore().proxy == "http://proxy.internal:3128"
    aws_env.setenv("NO_PROXY", ".amazonaws.com")
    assert from_botocore().proxy is None
    aws_env.delenv("NO_PROXY")
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:8000")  # http: HTTPS_PROXY does not apply
    assert from_botocore().proxy is None
    aws_env.setenv("HTTP_PROXY", "http://plain.internal:3128")
    assert from_botocore().proxy == "http://plain.internal:3128"


# Only http:// proxies are supported (http.client tunnels and forwards through them): another is refused at
# build, which the interceptor reports as IdempotencyConfigurationError.
def test_a_proxy_that_is_not_http_is_refused_at_build(aws_env):
    aws_env.setenv("HTTPS_PROXY", "https://proxy.internal:3128")
    with pytest.raises(ValueError) as caught:
        make_transport("lean", **OPTIONS)
    assert "proxy" in str(caught.value).lower()


def test_the_ca_bundle_is_the_one_botocore_would_load(aws_env, tmp_path):
    assert from_botocore().cafile == get_cert_path(True)
    aws_env.setenv("REQUESTS_CA_BUNDLE", "/r.pem")
    assert from_botocore().cafile == "/r.pem"
    aws_env.setenv("AWS_CA_BUNDLE", "/a.pem")
    assert from_botocore().cafile == "/a.pem"
    (tmp_path / "config").write_text("[default]\nca_bundle = /c.pem\n")
    aws_env.delenv("AWS_CA_BUNDLE")
    assert from_botocore().cafile == "/c.pem"  # the config file's, before REQUESTS_CA_BUNDLE
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:8000")
    assert from_botocore().cafile is None  # http: no TLS, no bundle


def test_tcp_keepalive_is_botocores_setting(aws_env):
    assert from_botocore().tcp_keepalive is False
    aws_env.setenv("BOTOCORE_TCP_KEEPALIVE", "true")
    assert from_botocore().tcp_keepalive is True


# -- every Region botocore knows, every variant (issue 28) ------------------------------------------------------

def _partitions() -> list[dict]:
    import botocore.session

    return botocore.session.Session().get_component("data_loader").load_data("partitions")["partitions"]


REGIONS = sorted(region for partition in _partitions() for region in partition["regions"]
                 if not region.endswith("-global"))  # aws-global and the like name a partition, not a Region
VARIANTS = [{}, {"AWS_USE_FIPS_ENDPOINT": "true"}, {"AWS_USE_DUALSTACK_ENDPOINT": "true"},
            {"AWS_USE_FIPS_ENDPOINT": "true", "AWS_USE_DUALSTACK_ENDPOINT": "true"}]
ACCOUNTS = [{}, {"AWS_ACCOUNT_ID": "123456789012"},
            {"AWS_ACCOUNT_ID": "123456789012", "AWS_ACCOUNT_ID_ENDPOINT_MODE": "preferred"},
            {"AWS_ACCOUNT_ID": "123456789012", "AWS_ACCOUNT_ID_ENDPOINT_MODE": "required"},
            {"AWS_ACCOUNT_ID": "123456789012", "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled"},
            {"AWS_ACCOUNT_ID_ENDPOINT_MODE": "required"}]


def _sent_by_boto3(loader) -> str:
    """Where a boto3 client made in this environment really sends a request: the URL of the signed request, just
    before it would go on the wire."""
    import boto3
    import botocore.session

    core = botocore.session.Session()
    core.register_component("data_loader", loader)
    client = boto3.session.Session(botocore_session=core).client("dynamodb")

    def stop(request, **kwargs):
        raise Sent(request.url)

    client.meta.events.register("before-send", stop)
    with pytest.raises(Sent) as sent:
        client.get_item(TableName="t", Key={"id": {"S": "k"}})
    return sent.value.args[0].rstrip("/")


@pytest.mark.slow
@pytest.mark.parametrize("region", REGIONS)
def test_every_region_and_variant_goes_where_a_boto3_client_sends(aws_env, region):
    """Issue 28: GovCloud with FIPS, the ISO partitions with dual-stack and AWS_ACCOUNT_ID_ENDPOINT_MODE=required
    went elsewhere than boto3 (or failed init) on the botocore path."""
    import botocore.session

    loader = botocore.session.Session().get_component("data_loader")
    aws_env.setenv("AWS_DEFAULT_REGION", region)
    compared = 0
    for variant in VARIANTS:
        for account in ACCOUNTS:
            for name in ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT", "AWS_ACCOUNT_ID",
                         "AWS_ACCOUNT_ID_ENDPOINT_MODE"):
                aws_env.delenv(name, raising=False)
            for name, value in {**variant, **account}.items():
                aws_env.setenv(name, value)
            try:
                expected: str | type[Exception] = _sent_by_boto3(loader)
            except Exception as error:  # boto3 cannot send from here (no such variant): nor may we
                expected = type(error)
            session = botocore.session.Session()
            session.register_component("data_loader", loader)
            if isinstance(expected, str):
                assert from_botocore(session).endpoint == expected, (variant, account)
                plain = plain_lambda(os.environ)
                assert plain is None or plain.endpoint == expected, (variant, account)
            else:
                with pytest.raises(Exception):  # noqa: B017 - whatever botocore raises for it
                    from_botocore(session)
            compared += 1
    assert compared == len(VARIANTS) * len(ACCOUNTS)
