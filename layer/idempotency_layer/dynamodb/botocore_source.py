"""Every environment but the plain Lambda one: botocore says where requests go and as whom.

Through public botocore APIs only: a session's credential provider chain (SnapStart's container credentials,
web identity, profiles, ...), region and CA bundle settings; a DynamoDB client's resolved endpoint URL and
config (configured endpoint URLs, FIPS, dual-stack, other partitions); botocore's endpoint rule set for
account-based endpoints; its reading of the proxy variables. The requests themselves go through the same client
and attempt loop as the plain case's. Imported only when that case does not apply.
"""

from __future__ import annotations

import os

from .target import Credentials, Target

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING:
    from botocore.session import Session

__all__ = ["from_botocore"]

_SERVICE = "dynamodb"
_API_VERSION = "2012-08-10"


def resolve_region(session: Session) -> str | None:
    # botocore reads only AWS_DEFAULT_REGION and the config file; Lambda also sets AWS_REGION (other SDKs read it).
    return session.get_config_variable("region") or os.environ.get("AWS_REGION") or None


def regional_endpoint(session: Session, region: str, account_id: str | None = None) -> str:
    """DynamoDB's endpoint for `region` from botocore's endpoint rule set (partitions, FIPS, dual-stack,
    account-based endpoints)."""
    from botocore.endpoint_provider import EndpointProvider
    from botocore.exceptions import DataNotFoundError
    from botocore.utils import ensure_boolean

    loader = session.get_component("data_loader")
    try:  # by path: finding the latest API version lists every service's directory (~10 ms)
        ruleset = loader.load_data(f"{_SERVICE}/{_API_VERSION}/endpoint-rule-set-1")
    except DataNotFoundError:  # pragma: no cover - a botocore that moved its data
        ruleset = loader.load_service_model(_SERVICE, "endpoint-rule-set-1")
    provider = EndpointProvider(ruleset_data=ruleset, partition_data=loader.load_data("partitions"))
    params: dict[str, Any] = {
        "Region": region,
        "UseFIPS": ensure_boolean(session.get_config_variable("use_fips_endpoint") or False),
        "UseDualStack": ensure_boolean(session.get_config_variable("use_dualstack_endpoint") or False),
    }
    mode = session.get_config_variable("account_id_endpoint_mode")
    if mode:
        params["AccountIdEndpointMode"] = mode
        if account_id and mode != "disabled":
            params["AccountId"] = account_id
    return provider.resolve_endpoint(**params).url


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
    # A client resolves the endpoint as boto3's would: configured endpoint URLs (variables, the config file's
    # services section), FIPS and dual-stack variants, other partitions. Its URL is the regional one when
    # nothing was configured; then the rule set decides, as a client does per request, since an account-based
    # endpoint depends on the credentials' account.
    client = session.create_client(_SERVICE, region_name=region)
    endpoint = client.meta.endpoint_url
    if endpoint == regional_endpoint(session, region):
        account_id = None
        if provider is not None:
            account_id = getattr(provider.get_frozen_credentials(), "account_id", None)
        if account_id:
            endpoint = regional_endpoint(session, region, account_id)
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
