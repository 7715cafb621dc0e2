"""stores.dynamodb.environment: which environments the plain Lambda source serves (without botocore) and which it
leaves to botocore, how it reads config and credentials files, endpoints, padded values and regions, the CA
bundle it trusts, and the credentials no path may send (check_sendable)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.aws.environment import UnsendableCredentials, ca_bundle, check_sendable
from idempotency_layer.aws.target import Credentials
from idempotency_layer.stores.dynamodb.environment import plain_lambda

LAMBDA = {
    "AWS_ACCESS_KEY_ID": "AKID",
    "AWS_SECRET_ACCESS_KEY": "s",
    "AWS_SESSION_TOKEN": "t",
    "AWS_REGION": "eu-west-1",
}


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    # ~/.aws/config and ~/.aws/credentials are looked for under HOME: none there unless a test writes one.
    monkeypatch.setenv("HOME", str(tmp_path))


def plan(tmp_path, **env):
    """plain_lambda on the Lambda environment changed by `env` (None removes a variable)."""
    merged = {"AWS_CONFIG_FILE": str(tmp_path / "none"), **LAMBDA, **env}
    return plain_lambda({k: v for k, v in merged.items() if v is not None})


def botocore_bundle():
    from botocore.httpsession import get_cert_path

    return get_cert_path(True)


# -- the plain Lambda environment -----------------------------------------------------------------------------


def test_the_lambda_environment_is_served_from_the_environment_alone(tmp_path):
    got = plan(tmp_path)
    assert (got.endpoint, got.region, got.proxy, got.tcp_keepalive, got.source) == (
        "https://dynamodb.eu-west-1.amazonaws.com", "eu-west-1", None, False, "environment")
    assert got.credentials() == Credentials("AKID", "s", "t")
    # https: the CA bundle botocore would use (certifi's when it imports, else botocore's own).
    assert got.cafile == botocore_bundle()


def test_tokens_as_botocore_reads_them(tmp_path):
    assert plan(tmp_path, AWS_SESSION_TOKEN=None).credentials().token is None
    assert plan(tmp_path, AWS_SESSION_TOKEN=None, AWS_SECURITY_TOKEN="legacy").credentials().token == "legacy"
    assert plan(tmp_path, AWS_SECURITY_TOKEN="legacy").credentials().token == "legacy"  # botocore reads it first
    # Empty is unset, for botocore too.
    assert plan(tmp_path, AWS_SESSION_TOKEN="", AWS_SECURITY_TOKEN="").credentials().token is None


def test_regions_as_botocore_reads_them(tmp_path):
    assert plan(tmp_path, AWS_REGION=None, AWS_DEFAULT_REGION="us-west-2").region == "us-west-2"
    assert plan(tmp_path, AWS_DEFAULT_REGION="us-west-2").region == "us-west-2"  # botocore's order: this first
    assert plan(tmp_path, AWS_DEFAULT_REGION="").region == "eu-west-1"  # empty: unset


def test_configured_endpoints(tmp_path):
    assert plan(tmp_path, AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:8000").endpoint == "http://127.0.0.1:8000"
    assert plan(tmp_path, AWS_ENDPOINT_URL="https://ddb.local/").endpoint == "https://ddb.local"
    assert plan(tmp_path, AWS_ENDPOINT_URL="http://a:1", AWS_ENDPOINT_URL_DYNAMODB="http://b:2").endpoint == (
        "http://b:2")
    # The template declares it empty so `sam local --env-vars` can set it: empty means unset.
    assert plan(tmp_path, AWS_ENDPOINT_URL_DYNAMODB="").endpoint == "https://dynamodb.eu-west-1.amazonaws.com"
    assert plan(tmp_path, AWS_ENDPOINT_URL_DYNAMODB="", AWS_ENDPOINT_URL="http://g:1").endpoint == "http://g:1"
    # A configured endpoint serves any region botocore would accept.
    assert plan(tmp_path, AWS_REGION="local", AWS_ENDPOINT_URL="http://127.0.0.1:8000").region == "local"


def test_the_transport_kind_is_not_the_sources_business(tmp_path):
    assert plan(tmp_path, IDEMPOTENCY_TRANSPORT="boto3") is not None  # make_transport decides on the kind


def test_the_ca_bundle_matters_to_https_only(tmp_path):
    assert plan(tmp_path, AWS_CA_BUNDLE="/ca.pem", AWS_ENDPOINT_URL="http://127.0.0.1:8000").cafile is None
    assert plan(tmp_path, AWS_CA_BUNDLE="/ca.pem").cafile == "/ca.pem"
    assert plan(tmp_path, AWS_CA_BUNDLE="/a.pem", REQUESTS_CA_BUNDLE="/r.pem").cafile == "/a.pem"
    assert plan(tmp_path, REQUESTS_CA_BUNDLE="/r.pem").cafile == "/r.pem"
    assert plan(tmp_path, AWS_CA_BUNDLE="", REQUESTS_CA_BUNDLE="/r.pem").cafile == "/r.pem"
    # DynamoDB Local over http stays on the plain path whatever the bundle variables say.
    assert plan(tmp_path, AWS_CA_BUNDLE="", AWS_ENDPOINT_URL="http://127.0.0.1:8000") is not None


@pytest.mark.parametrize(
    "env",
    [
        {"AWS_ACCESS_KEY_ID": None},
        {"AWS_SECRET_ACCESS_KEY": ""},
        {"AWS_REGION": None},
        {"AWS_PROFILE": "dev"},
        {"AWS_DEFAULT_PROFILE": "dev"},
        {"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials"},
        {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/creds"},
        {"AWS_CONTAINER_AUTHORIZATION_TOKEN": "x"},
        {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": "/token"},
        {"AWS_WEB_IDENTITY_TOKEN_FILE": "/token"},
        {"AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/r"},
        {"AWS_CREDENTIAL_EXPIRATION": "2030-01-01T00:00:00Z"},
        {"AWS_USE_FIPS_ENDPOINT": "true"},
        {"AWS_USE_FIPS_ENDPOINT": "false"},  # botocore reads it; left to botocore whatever it says
        {"AWS_USE_DUALSTACK_ENDPOINT": "true"},
        {"AWS_ACCOUNT_ID": "123456789012"},
        {"AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled"},
        {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"},
        # Set at all, even empty: botocore reads it (an empty AWS_PROFILE is a profile it cannot find).
        {"AWS_PROFILE": ""},
        {"HTTPS_PROXY": ""},
        {"AWS_USE_FIPS_ENDPOINT": ""},
        # Values botocore takes as they are, white space and all, and so reads otherwise or refuses.
        {"AWS_ACCESS_KEY_ID": " AKID"},
        {"AWS_SECRET_ACCESS_KEY": "s "},
        {"AWS_SESSION_TOKEN": " "},
        {"AWS_SECURITY_TOKEN": "t\t"},
        {"AWS_REGION": " eu-west-1"},
        {"AWS_DEFAULT_REGION": " "},
        {"AWS_ENDPOINT_URL_DYNAMODB": " http://127.0.0.1:8000"},
        {"AWS_ENDPOINT_URL": " "},
        {"AWS_CA_BUNDLE": " /ca.pem"},
        {"AWS_CA_BUNDLE": ""},  # botocore's clients refuse an empty one; its lean path falls back to certifi
        {"REQUESTS_CA_BUNDLE": ""},
        {"AWS_REGION": "-eu-west-1"},
        {"HTTPS_PROXY": "http://proxy:3128"},
        {"https_proxy": "http://proxy:3128"},
        {"HTTP_PROXY": "http://proxy:3128"},
        {"AWS_REGION": "cn-north-1"},
        {"AWS_REGION": "us-gov-west-1"},
        {"AWS_REGION": "us-iso-east-1"},
        {"AWS_REGION": "us-isob-east-1"},
        {"AWS_REGION": "eu-isoe-west-1"},
        {"AWS_REGION": "nowhere"},
        {"AWS_REGION": "eu-west-1.evil.com/"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "ftp://x"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://x/path"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://x?q=1"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://user@x"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://[::1]:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://x:notaport"},
        # Proxy variables in any case, as urllib.request.getproxies_environment reads them for botocore.
        {"Https_Proxy": "http://proxy:3128"},
        {"HTTP_proxy": "http://proxy:3128"},
        {"all_PROXY": "http://proxy:3128"},
        # Hosts botocore refuses (or, for the last two, reads its own way): botocore says what is wrong.
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://my_ddb:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://a..b:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://-a.b:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://dynamod\u00e9.local:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://\u0661\u0662\u0663:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://local\nhost:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://local\thost:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://" + "a" * 64 + ".b:8000"},
        {"AWS_ENDPOINT_URL_DYNAMODB": "http://dynamodb.local.:8000"},
        # botocore settings that change where or how requests go.
        {"AWS_DATA_PATH": "/somewhere"},
        {"BOTOCORE_TCP_KEEPALIVE": "true"},
    ],
)
def test_every_other_environment_is_botocores(tmp_path, env):
    assert plan(tmp_path, **env) is None


def test_no_proxy_alone_keeps_the_plain_path(tmp_path):
    assert plan(tmp_path, NO_PROXY="169.254.169.254", no_proxy="localhost") is not None


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from("aZ09-._\u00e9\u0131\u0661:@/[]\n"), min_size=1, max_size=20))
def test_every_endpoint_the_plain_path_takes_botocore_takes_as_is(host):
    # The plain path sends only to URLs botocore would accept, and to the same host and port.
    from urllib.parse import urlsplit

    from botocore.utils import is_valid_endpoint_url

    url = f"http://{host}"
    target = plain_lambda({**LAMBDA, "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                           "AWS_ENDPOINT_URL_DYNAMODB": url})
    if target is not None:
        assert is_valid_endpoint_url(url)
        theirs = urlsplit(url)
        assert target.endpoint == f"http://{theirs.hostname}" + ("" if theirs.port is None else f":{theirs.port}")


# -- config and credentials files -----------------------------------------------------------------------------


def test_a_config_file_is_botocores(tmp_path):
    (tmp_path / "config").write_text("[default]\nregion = eu-west-1\n")
    assert plan(tmp_path, AWS_CONFIG_FILE=str(tmp_path / "config")) is None
    (tmp_path / "empty").write_text("")
    assert plan(tmp_path, AWS_CONFIG_FILE=str(tmp_path / "empty")) is not None
    assert plan(tmp_path, AWS_CONFIG_FILE=os.devnull) is not None


@pytest.mark.parametrize(("variable", "default"), [("AWS_CONFIG_FILE", "config"),
                                                   ("AWS_SHARED_CREDENTIALS_FILE", "credentials")])
def test_a_config_or_credentials_file_is_found_as_botocore_finds_it(tmp_path, variable, default):
    # botocore expands variables and `~` in both paths, and reads settings such as endpoint_url and ca_bundle
    # from the credentials file's profiles too; so must the check that sends it there. HOME is tmp_path.
    (tmp_path / "cfg").write_text("[default]\nendpoint_url = https://elsewhere.example\n")
    assert plan(tmp_path, **{variable: "~/cfg"}) is None
    assert plan(tmp_path, **{variable: "$HOME/cfg"}) is None
    (tmp_path / "empty").write_text("")
    assert plan(tmp_path, **{variable: str(tmp_path / "empty")}) is not None
    (tmp_path / ".aws").mkdir()
    assert plain_lambda(LAMBDA) is not None
    (tmp_path / ".aws" / default).write_text("[default]\nendpoint_url = https://elsewhere.example\n")
    assert plain_lambda(LAMBDA) is None  # the default ~/.aws/<file>
    # Set but empty, botocore reads no file; nor one it cannot read, such as a directory.
    assert plain_lambda({**LAMBDA, variable: ""}) is not None
    assert plain_lambda({**LAMBDA, variable: str(tmp_path)}) is not None


# -- the CA bundle --------------------------------------------------------------------------------------------


def test_ca_bundle_is_the_one_botocore_would_load(tmp_path):
    assert ca_bundle({}) == botocore_bundle()
    assert ca_bundle({"AWS_CA_BUNDLE": "/a.pem", "REQUESTS_CA_BUNDLE": "/r.pem"}) == "/a.pem"
    assert ca_bundle({"REQUESTS_CA_BUNDLE": "/r.pem"}) == "/r.pem"
    assert ca_bundle({"AWS_CA_BUNDLE": "~/ca.pem"}) == str(tmp_path / "ca.pem")  # as urllib3 expands it
    # SSL_CERT_FILE / SSL_CERT_DIR play no part: urllib3 loads only the bundle botocore hands it.
    assert ca_bundle({"SSL_CERT_FILE": "/x.pem", "SSL_CERT_DIR": "/x"}) == botocore_bundle()
    # Empty or padded: botocore's to refuse or read its own way.
    for env in ({"AWS_CA_BUNDLE": ""}, {"REQUESTS_CA_BUNDLE": ""}, {"AWS_CA_BUNDLE": " /a.pem"}):
        assert ca_bundle(env) is None, env


# -- credentials that cannot be sent --------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value"), [
    ("AWS_SESSION_TOKEN", "tok\r\nX-Injected: 1"),
    ("AWS_SESSION_TOKEN", "tok\nen"),
    ("AWS_SESSION_TOKEN", "tok\x00en"),
    ("AWS_SECURITY_TOKEN", "legacy\r"),
    ("AWS_ACCESS_KEY_ID", "AKID\r\nX-Injected: 1"),
    ("AWS_SESSION_TOKEN", "t\u20acken"),  # not Latin-1: http.client could not encode it
])
def test_credentials_that_cannot_go_in_a_header_are_refused_naming_the_variable(name, value):
    with pytest.raises(UnsendableCredentials) as caught:
        check_sendable({**LAMBDA, name: value})
    assert isinstance(caught.value, ValueError)
    assert name in str(caught.value) and value not in str(caught.value) and "X-Injected" not in str(caught.value)


def test_a_secret_that_is_not_utf8_is_refused_naming_the_variable():
    with pytest.raises(UnsendableCredentials) as caught:
        check_sendable({**LAMBDA, "AWS_SECRET_ACCESS_KEY": "secret\udcffvalue"})  # the byte 0xff, as os.environ has it
    assert "AWS_SECRET_ACCESS_KEY" in str(caught.value)
    assert "secret" not in str(caught.value).replace("AWS_SECRET_ACCESS_KEY", "")
    assert caught.value.__context__ is None  # no UnicodeEncodeError holding the secret behind it


def test_credentials_that_can_be_sent_pass():
    check_sendable(LAMBDA)
    check_sendable({**LAMBDA, "AWS_SESSION_TOKEN": "t\u00e9ken", "AWS_SECRET_ACCESS_KEY": "s\u20ac"})  # Latin-1; UTF-8
    check_sendable({})
