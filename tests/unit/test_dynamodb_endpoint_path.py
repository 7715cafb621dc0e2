"""An endpoint URL with a path is reached as botocore reaches it (issue 42, a regression a hostile review found:
`http://host:port/ddb/v1/` was posted to `/ddb/v1`, so a gateway routing that exact path refused every request).

Every way a target is read (AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL, the config file's services section, the
CLI's --endpoint-url) is compared on a loopback server with what a real botocore client sends there: the request
target byte for byte, and the signature botocore's SigV4Auth makes of the request the layer sent."""

from __future__ import annotations

import datetime
import re
from typing import Any
from urllib.parse import quote, urlsplit

import boto3
import pytest
from botocore import auth
from botocore.utils import normalize_url_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer.aws.target import request_target
from idempotency_layer.cli import main
from idempotency_layer.stores.dynamodb import make_transport
from tests.support.scripted_dynamodb import OPTIONS, ScriptedDynamoDB, answer
from tests.unit.test_dynamodb_sigv4 import botocore_sign

GET = {"TableName": "orders", "Key": {"id": {"S": "k"}}}

PATHS = [
    "", "/", "/ddb/v1/", "/ddb/v1", "/ddb/v1//", "/ddb?x=1", "/ddb/?b=2&a=1", "/ddb/v1%3Fx=1/", "/a=b&c=d/",
    "/caf%C3%A9/", "/caf%c3%a9/", "/café/", "/a b/", "/a%zz/", "/a/../b/", "/./a/", "//x//", "/a;b=c/", "/~u/",
    "/a%2Fb", "/ddb#frag", "/p?q=é&r",
]


def botocore_sends(endpoint: str) -> None:
    boto3.client("dynamodb", endpoint_url=endpoint, region_name="eu-west-1").get_item(**GET)


def signed_as_botocore(server: ScriptedDynamoDB, index: int, url: str) -> bool:
    """Whether request `index`'s Authorization is what botocore's SigV4Auth signs for `url` (the endpoint as
    configured, which botocore signs) with that request's own headers, body and instant."""
    headers, body = server.requests[index]
    names = re.search(r"SignedHeaders=([^,]+)", headers["Authorization"]).group(1).split(";")
    signed = {name: value for name, value in headers.items() if name.lower() in names}
    when = datetime.datetime.strptime(headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
    expected = botocore_sign("AKIDEXAMPLE", "secret", None, "eu-west-1", "dynamodb", url, signed, body, when)
    return headers["Authorization"] == expected["Authorization"]


@pytest.fixture
def server(aws_env: pytest.MonkeyPatch) -> Any:
    aws_env.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    aws_env.delenv("AWS_SESSION_TOKEN", raising=False)
    started = ScriptedDynamoDB([answer(body={})])
    yield started
    started.close()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("way", ["AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL", "config"])
def test_the_layer_posts_where_botocore_posts_and_signs_as_it_signs(server, aws_env, tmp_path, way, path):
    url = server.endpoint + path
    if way == "config":
        (tmp_path / "config").write_text(
            f"[default]\nservices = local\n\n[services local]\ndynamodb =\n  endpoint_url = {url}\n")
        aws_env.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    else:
        aws_env.setenv(way, url)
    boto3.client("dynamodb", region_name="eu-west-1").get_item(**GET)  # botocore reads the same configuration
    make_transport("lean", **OPTIONS).call("GetItem", dict(GET))
    assert server.paths[1] == server.paths[0], (server.paths, url)
    assert signed_as_botocore(server, 1, url)


def test_the_trailing_slash_the_review_found_cut_is_kept(server, aws_env):
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", server.endpoint + "/ddb/v1/")
    transport = make_transport("lean", **OPTIONS)
    transport.call("GetItem", dict(GET))
    assert server.paths == ["/ddb/v1/"] and transport.endpoint == server.endpoint + "/ddb/v1/"


@pytest.mark.parametrize("path", ["/ddb/v1/", "/ddb/v1", "/ddb/v1%3Fx=1/", "/café/?q=1"])
def test_the_cli_posts_where_botocore_posts(server, aws_env, capsys, path):
    url = server.endpoint + path
    botocore_sends(url)
    status = main(["show", "orders#k", "--table", "orders", "--region", "eu-west-1", "--endpoint-url", url])
    assert status == 1 and "no record" in capsys.readouterr().err.lower()
    assert server.paths[1:] == server.paths[:1] * (len(server.paths) - 1), server.paths
    assert all(signed_as_botocore(server, index, url) for index in range(1, len(server.paths)))


def _followed(path: str) -> bool:
    return ";" not in path.rpartition("/")[2]  # refused: test_a_semicolon_in_the_last_segment_is_refused


# Paths and queries of every sort a URL can hold: unreserved and reserved characters, escapes (valid, lower-case
# and broken), non-ASCII letters, spaces, dot segments and empty segments.
_PIECES = st.sampled_from(["a", "Z9", "-._~", "!$&'()*+,;=:@", "%2F", "%3f", "%zz", "%", "é", "€", " ", ".", "..",
                           "", "=", "&"])
_PATH = st.lists(st.lists(_PIECES, max_size=3).map("".join), max_size=5).map(lambda parts: "/" + "/".join(parts)
                                                                              ).filter(_followed)
_QUERY = st.one_of(st.just(""), st.lists(_PIECES, min_size=1, max_size=4).map(lambda parts: "?" + "".join(parts)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=_PATH, query=_QUERY)
def test_any_path_and_query_reach_and_sign_as_botocore(server, aws_env, path, query):
    url = server.endpoint + path + query
    before = len(server.paths)
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", url)
    botocore_sends(url)
    make_transport("lean", **OPTIONS).call("GetItem", dict(GET))
    assert server.paths[before + 1] == server.paths[before], url
    assert signed_as_botocore(server, before + 1, url)


@settings(max_examples=300, deadline=None)
@given(path=_PATH, query=_QUERY)
def test_the_signed_path_and_query_are_botocores_canonical_ones(path, query):
    target = request_target("http://h" + path + query)
    parts = urlsplit("http://h" + path + query)
    assert target.signed_path == quote(normalize_url_path(parts.path), safe="/~")  # SigV4Auth._normalize_url_path
    assert target.signed_query == auth.SigV4Auth(None, "dynamodb", "eu-west-1")._canonical_query_string_url(parts)


@pytest.mark.parametrize("path", ["/ddb;v=1", "/a/b;c", "/x/;"])
def test_a_semicolon_in_the_last_segment_is_refused(server, aws_env, capsys, path):
    # botocore sends these without the segment's parameters (urlparse) and signs them with (urlsplit): its requests
    # are refused by a service that checks signatures, so init fails naming the fix instead.
    url = server.endpoint + path
    botocore_sends(url)
    assert server.paths[0] != urlsplit(url).path  # botocore really cuts it
    aws_env.setenv("AWS_ENDPOINT_URL_DYNAMODB", url)
    with pytest.raises(ValueError, match=r"last path segment holds ';'.*%3B"):
        make_transport("lean", **OPTIONS)
    assert main(["show", "orders#k", "--table", "orders", "--region", "eu-west-1", "--endpoint-url", url]) == 2
    assert "last path segment holds ';'" in capsys.readouterr().err
    assert server.count == 1  # nothing sent
