"""The plain Lambda environment: credentials, region and endpoint read from environment variables alone.

`plain_lambda(environ)` says whether the environment is that case: static credentials and a region in the
environment, and nothing that changes where or how requests go (profiles, config files, container or web
identity credentials, SnapStart's among them, FIPS or dual-stack endpoints, account-based endpoints, proxies).
Then no botocore is imported at all; in every other case `botocore_source` asks botocore. Values are read as
botocore reads them, so the two sources never disagree on an environment both could serve.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ...aws.environment import PADDED, ca_bundle, raw
from ...aws.target import Credentials, Target

__all__ = ["plain_lambda"]

# Regions of the `aws` partition: their DynamoDB endpoint is dynamodb.<region>.amazonaws.com. China
# (amazonaws.com.cn), GovCloud (us-gov-), the ISO partitions (us-iso-, eu-isoe-...) and anything else that
# does not match go through botocore's endpoint rules.
_AWS_REGION = re.compile(
    r"(us|af|ap|ca|eu|il|me|mx|sa)-(east|west|north|south|central|northeast|southeast|northwest|southwest)-[0-9]{1,2}"
)

# Variables that change credentials, endpoints or the HTTP path as botocore resolves them: any of them set
# (non-empty) and the botocore path is used, so behaviour stays exactly botocore's.
_BOTOCORE_VARIABLES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CREDENTIAL_EXPIRATION",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_USE_FIPS_ENDPOINT",
    "AWS_USE_DUALSTACK_ENDPOINT",
    "AWS_ACCOUNT_ID",
    "AWS_ACCOUNT_ID_ENDPOINT_MODE",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_DATA_PATH",  # botocore's data, its endpoint rules among them, from elsewhere
    "BOTOCORE_TCP_KEEPALIVE",
)


def _proxied(environ: Mapping[str, str]) -> bool:
    """A proxy variable is set: any `<scheme>_proxy` in any case, as urllib.request.getproxies_environment (which
    botocore uses) reads them; NO_PROXY alone changes nothing."""
    for name in environ:
        lower = name.lower()
        if lower.endswith("_proxy") and lower != "no_proxy":
            return True
    return False


# botocore.utils.validate_region_name: a region is a host label.
_HOST_LABEL = re.compile(r"(?![0-9]+$)(?!-)[a-zA-Z0-9-]{,63}(?<!-)")


def plain_lambda(environ: Mapping[str, str]) -> Target | None:
    """Where requests go and as whom, read from the environment alone, or None: botocore must resolve it.

    Values are taken as botocore takes them: not stripped. One that botocore would read differently (white
    space around it) or refuse sends the environment to botocore, which then does exactly what it does."""
    # Set at all, even empty, and botocore decides (an empty AWS_PROFILE is a profile botocore cannot find).
    if any(name in environ for name in _BOTOCORE_VARIABLES) or _proxied(environ):
        return None
    # A config file may hold a region, endpoints, a CA bundle, retry or TCP settings, and botocore reads the
    # shared credentials file's profiles for those settings too: either non-empty and botocore decides. Their
    # paths expanded as botocore expands them: variables, then `~`.
    files = (("AWS_CONFIG_FILE", "~/.aws/config"), ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"))
    for variable, default in files:
        # Set but empty, botocore reads no file at all; one it cannot read (a directory, no permission) neither.
        path = os.path.expanduser(os.path.expandvars(environ.get(variable, default)))
        try:
            with open(path, "rb") as f:
                if f.read(1):  # an empty one (or /dev/null) holds no settings
                    return None
        except OSError:
            pass
    access_key = raw(environ, "AWS_ACCESS_KEY_ID")
    secret_key = raw(environ, "AWS_SECRET_ACCESS_KEY")
    # botocore's order: AWS_DEFAULT_REGION (as the config chain finds it), then Lambda's AWS_REGION.
    region = raw(environ, "AWS_DEFAULT_REGION") or raw(environ, "AWS_REGION")
    # botocore's order: the legacy AWS_SECURITY_TOKEN first.
    token = raw(environ, "AWS_SECURITY_TOKEN") or raw(environ, "AWS_SESSION_TOKEN")
    configured = raw(environ, "AWS_ENDPOINT_URL_DYNAMODB") or raw(environ, "AWS_ENDPOINT_URL")
    read = (access_key, secret_key, region, token, configured)
    if not (access_key and secret_key and region) or PADDED in read:
        return None
    if not _HOST_LABEL.fullmatch(region):
        return None  # botocore's validate_region_name refuses it (or the endpoint rules do)
    if configured:
        endpoint = _plain_url(configured)
        if endpoint is None:
            return None  # botocore validates it and says what is wrong
    elif _AWS_REGION.fullmatch(region):
        endpoint = f"https://dynamodb.{region}.amazonaws.com"
    else:
        return None
    cafile = None
    if endpoint.startswith("https:"):  # a CA bundle matters only to TLS: DynamoDB Local over http stays here
        cafile = ca_bundle(environ)
        if cafile is None:
            return None
    credentials = Credentials(access_key, secret_key, token)
    return Target(endpoint, region, lambda: credentials, cafile)


_HOST_NAME = re.compile(r"((?!-)[A-Za-z0-9-]{1,63}(?<!-)\.)*((?!-)[A-Za-z0-9-]{1,63}(?<!-))")


def _plain_url(url: str) -> str | None:
    """`scheme://host[:port]` for an http(s) URL without path, query, user or IPv6 literal; else None."""
    from urllib.parse import urlsplit

    if any(c in url for c in "\t\r\n"):  # urlsplit drops them; botocore refuses the URL
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    if parts.query or parts.fragment or "@" in parts.netloc or "[" in parts.netloc:
        return None
    host = parts.hostname
    # botocore.utils.is_valid_endpoint_url's host names, in ASCII only (its pattern also lets some non-ASCII
    # letters and digits through), without its trailing dot: anything else is botocore's to refuse or to send.
    if len(host) > 255 or not host.isascii() or not _HOST_NAME.fullmatch(host):
        return None
    return f"{parts.scheme}://{host}" + ("" if port is None else f":{port}")
