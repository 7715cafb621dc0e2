"""The AWS kit's reading of the environment, for every backend: credentials that can be sent in a header
(`check_sendable`), the CA bundle botocore would trust (`ca_bundle`) and the credentials S3 and a Valkey IAM token
sign with (`function_credentials`), each read as botocore reads the variables, without importing it."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

__all__ = [
    "PADDED", "UnsendableCredentials", "ca_bundle", "check_sendable", "function_credentials", "raw", "unsendable",
]


class UnsendableCredentials(ValueError):
    """A credential variable holds what cannot go into an HTTP header; the message names it, never its value."""


# What http.client refuses in a header value (botocore's requests then fail with the value in the message), or
# what would end the header and start another: refused at init instead, on every path.
_UNSENDABLE = re.compile(r"[\r\n\x00]|[^\x00-\xff]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # what os.environ makes of bytes that are not UTF-8


def unsendable(value: str) -> bool:
    """Whether `value` cannot go into an HTTP header as it is (a CR, LF or NUL, or a character outside Latin-1)."""
    return bool(_UNSENDABLE.search(value))


def check_sendable(environ: Mapping[str, str]) -> None:
    """Refuse credentials in the environment that would be sent in a header they could break (a CR or LF:
    header injection) or that cannot be sent (not Latin-1), naming the variable, never its value."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN"):
        value = environ.get(name)
        if value and _UNSENDABLE.search(value):
            raise UnsendableCredentials(
                f"{name} holds a character that cannot be sent in an HTTP header (a carriage return, line feed, "
                "NUL, or one outside Latin-1); set it to the credential exactly as issued"
            )
    # The secret is never sent, but signing encodes it as UTF-8: bytes that are not UTF-8 (kept by Python as
    # lone surrogates) would fail every request with the secret inside the UnicodeEncodeError.
    # Looked for, not tried: a failed encode would keep the secret in the exception's context.
    secret = environ.get("AWS_SECRET_ACCESS_KEY")
    if secret and _SURROGATE.search(secret):
        raise UnsendableCredentials(
            "AWS_SECRET_ACCESS_KEY holds bytes that are not UTF-8, so no request could be signed with it; set it "
            "to the credential exactly as issued"
        )


def raw(environ: Mapping[str, str], name: str) -> str | None:
    """The variable as botocore reads it: None when unset or empty, and `PADDED` when a blank or padded
    value makes botocore's answer differ from what the stripped value would give."""
    value = environ.get(name)
    if not value:
        return None
    if value != value.strip():
        return PADDED
    return value


PADDED = "\x00padded"  # a marker: a value with surrounding white space, which botocore takes as it is


def ca_bundle(environ: Mapping[str, str]) -> str | None:
    """The CA bundle botocore would verify DynamoDB's certificate against, or None: leave it to botocore.

    The lean botocore path's resolution (`ca_bundle` from AWS_CA_BUNDLE, then REQUESTS_CA_BUNDLE, then
    botocore.httpsession.get_cert_path: certifi's cacert.pem when certifi imports, else botocore's own), found
    without importing either. urllib3 loads only that file, so SSL_CERT_FILE / SSL_CERT_DIR play no part.
    """
    if "AWS_CA_BUNDLE" in environ or "REQUESTS_CA_BUNDLE" in environ:
        value = raw(environ, "AWS_CA_BUNDLE") or raw(environ, "REQUESTS_CA_BUNDLE")
        if value is None or value == PADDED:
            return None  # empty or blank: botocore's InvalidConfigError, or its own reading of it
        return os.path.expanduser(value)  # as urllib3 expands its ca_certs
    from importlib.util import find_spec

    for package in ("certifi", "botocore"):
        try:
            spec = find_spec(package)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        bundle = os.path.join(next(iter(spec.submodule_search_locations)), "cacert.pem")
        if os.path.isfile(bundle):
            return bundle
        return None  # a package botocore would import but whose file we cannot see (a zip): botocore decides
    return None


def function_credentials(environ: Mapping[str, str]) -> tuple[str, str, str | None] | None:
    """The credentials to sign with outside the DynamoDB client (S3, a Valkey IAM token): the ones Lambda sets in
    the environment, else botocore's chain (a profile: the operator CLI's case); None when there are none."""
    access, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
    if access and secret:
        return access, secret, environ.get("AWS_SESSION_TOKEN") or None
    import botocore.session  # only off Lambda's plain environment

    found = botocore.session.get_session().get_credentials()
    if found is None:
        return None
    frozen = found.get_frozen_credentials()
    return frozen.access_key, frozen.secret_key, frozen.token
