"""Every environment but the plain Lambda one: botocore says where requests go and as whom.

Through public botocore APIs only: a session's credential provider chain (SnapStart's container credentials,
web identity, profiles, ...), region and CA bundle settings; where a DynamoDB client's requests go, asked of the
client itself through its `before-call` event (configured endpoint URLs, FIPS, dual-stack, other partitions,
account-based endpoints); its config and its reading of the proxy variables. The requests themselves go
through the same client and attempt loop as the plain case's. Imported only when that case does not apply.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from ...aws.target import Credentials, Target

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING:
    from botocore.session import Session

__all__ = ["from_botocore"]

_SERVICE = "dynamodb"


def resolve_region(session: Session) -> str | None:
    # botocore reads only AWS_DEFAULT_REGION and the config file; Lambda also sets AWS_REGION (other SDKs read it).
    return session.get_config_variable("region") or os.environ.get("AWS_REGION") or None


def sent_to(client: Any) -> str:
    """The endpoint URL a request of `client` goes to, as the client itself resolves it for each request (its
    endpoint rule set with every builtin: the region and partition, FIPS, dual-stack, an account-based endpoint
    from the credentials' account, a configured endpoint URL): one request made up to botocore's public
    `before-call` event and answered there, so nothing is signed or sent."""
    from botocore.awsrequest import AWSResponse

    seen: list[str] = []

    def answer(params: dict, **_: Any) -> tuple[Any, dict]:
        seen.append(params["url"])
        return AWSResponse(params["url"], 200, {}, None), {}

    event = f"before-call.{_SERVICE}.GetItem"
    client.meta.events.register_first(event, answer, unique_id="idempotency-layer-endpoint")
    try:
        client.get_item(TableName="idempotency-layer-endpoint", Key={"id": {"S": "endpoint"}})
    finally:
        client.meta.events.unregister(event, unique_id="idempotency-layer-endpoint")
    url = seen[0]
    # The request's URL is the endpoint joined with the operation's path ("/"): botocore keeps an endpoint's own
    # path as it is (a trailing slash too) and gives one without a path "/". Only that "/" is cut, so the endpoint
    # prints as configured; the client posts to "/" for it, and to the path as it is for every other.
    return url[:-1] if url.endswith("/") and urlsplit(url).path == "/" else url


def from_botocore(session: Session | None = None) -> Target:
    """The target a boto3 DynamoDB client in this environment would use."""
    from botocore.exceptions import NoRegionError
    from botocore.httpsession import get_cert_path
    from botocore.utils import get_environ_proxies, is_valid_endpoint_url, is_valid_ipv6_endpoint_url

    if session is None:
        from botocore.session import Session

        session = Session()
    provider = session.get_credentials()  # the whole chain; refreshable credentials refresh themselves
    region = resolve_region(session)
    if not region:
        raise NoRegionError()
    # A boto3-style client in this environment, asked where its requests go: configured endpoint URLs (variables,
    # the config file's services section), FIPS and dual-stack variants, other partitions, account-based
    # endpoints. (Its `meta.endpoint_url` is not always that: the rule set decides per request.)
    client = session.create_client(_SERVICE, region_name=region)
    endpoint = sent_to(client)
    if not (is_valid_endpoint_url(endpoint) or is_valid_ipv6_endpoint_url(endpoint)):
        raise ValueError(f"Invalid endpoint: {endpoint}")
    config = client.meta.config
    proxies = config.proxies or get_environ_proxies(endpoint)
    proxy = proxies.get(endpoint.split("://", 1)[0].lower()) if proxies else None
    if proxy and "://" not in proxy:
        proxy = "http://" + proxy  # as botocore reads a proxy without a scheme
    verify = session.get_config_variable("ca_bundle") or os.environ.get("REQUESTS_CA_BUNDLE") or True
    cafile = get_cert_path(verify) if endpoint.lower().startswith("https:") else None

    def credentials() -> Credentials | None:
        if provider is None:
            return None
        frozen = provider.get_frozen_credentials()  # refreshed when near expiry
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)

    from botocore.utils import ensure_boolean

    def may_wait() -> bool:
        # RefreshableCredentials (container, SnapStart, web identity, SSO...) fetch anew when a refresh is due.
        due = getattr(provider, "refresh_needed", None)
        return due is not None and bool(due())

    keepalive = ensure_boolean(session.get_config_variable("tcp_keepalive") or False)
    return Target(endpoint, region, credentials, cafile, proxy or None, keepalive, "botocore", may_wait)
