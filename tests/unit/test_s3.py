"""The large-results bucket's signing (layer/idempotency_layer/stores/s3.py) against botocore's S3SigV4Auth: the same
Authorization for generated object keys, bodies, times and session tokens, path style and virtual-hosted."""

from __future__ import annotations

import datetime
import hashlib
from unittest import mock
from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer.aws.sigv4 import Signer


@settings(max_examples=60, deadline=None)
@given(key=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1,
                   max_size=60),
       body=st.binary(max_size=2000), token=st.one_of(st.none(), st.text(alphabet="AB01/+=", min_size=1,
                                                                               max_size=30)),
       seconds=st.integers(min_value=1_600_000_000, max_value=2_000_000_000),
       method=st.sampled_from(["PUT", "GET", "DELETE"]), path_style=st.booleans())
def test_an_s3_request_is_signed_as_botocore_signs_it(key: str, body: bytes, token: str | None, seconds: int,
                                                     method: str, path_style: bool) -> None:
    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    host, base = ("127.0.0.1:4566", "/bucket-1") if path_style else ("bucket-1.s3.eu-west-1.amazonaws.com", "")
    path = f"{base}/{quote('idempotency-results/' + key, safe='/-_.~')}"
    body = body if method == "PUT" else b""
    headers = {"Host": host, "x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
    if method == "PUT":
        headers["x-amz-server-side-encryption"] = "AES256"
    ours = Signer("AKIDEXAMPLE", "secret/key+1", token, "eu-west-1", "s3").sign(dict(headers), body, method=method,
                                                                               path=path, now=seconds)
    when = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).replace(tzinfo=None)
    request = AWSRequest(method=method, url=f"http://{host}{path}", data=body, headers=dict(headers))
    with mock.patch.object(botocore.auth, "get_current_datetime", lambda: when):
        botocore.auth.S3SigV4Auth(Credentials("AKIDEXAMPLE", "secret/key+1", token), "s3", "eu-west-1").add_auth(
            request)
    assert ours["Authorization"] == request.headers["Authorization"]


def test_an_s3_error_code_that_is_no_codes_name_is_not_quoted() -> None:
    from idempotency_layer.stores.s3 import _code

    assert _code(b"<Error><Code>NoSuchKey</Code></Error>") == "NoSuchKey"
    for hostile in (b"X\n[ERROR] forged SECRET", b"A B", b"", b"x" * 65, b"\xc3\xa9"):
        assert _code(b"<Error><Code>" + hostile + b"</Code></Error>") == "?"
