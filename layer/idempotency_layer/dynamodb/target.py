"""Where requests go and as whom: what a credential and endpoint source (`environment`, `botocore_source`)
hands the client."""

from __future__ import annotations

from collections import namedtuple

__all__ = ["Credentials", "Target"]


class Credentials(namedtuple("Credentials", ("access_key", "secret_key", "token"))):
    # access_key: str
    # secret_key: str
    # token: str | None
    __slots__ = ()


class Target(namedtuple("Target", (
    "endpoint",
    "region",
    "credentials",
    "cafile",
    "proxy",
    "tcp_keepalive",
    "source",
    "may_wait",
), defaults=(None, None, False, "environment", None))):
    # endpoint: str  # scheme://host[:port][/path]
    # region: str
    # Called before every attempt: refreshable credentials (SnapStart's, a container's) change under a client.
    # None: there are none to sign with. It may raise: the source could not get them.
    # credentials: Callable[[], Credentials | None]
    # cafile: str | None = None  # for https: the CA bundle to trust (None: OpenSSL's defaults)
    # proxy: str | None = None  # an http:// proxy URL
    # tcp_keepalive: bool = False
    # source: str = "environment"  # which source resolved it: "environment" or "botocore"
    # may_wait: Callable[[], bool] | None = None  # True when `credentials()` may wait on the network now (a
    # refresh is due): the client then bounds it by the attempt's time
    __slots__ = ()
