"""Where requests go and as whom: what a credential and endpoint source (`environment`, `botocore_source`)
hands the client."""

from __future__ import annotations

from collections import namedtuple

__all__ = ["Credentials", "Target"]


TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NamedTuple

if TYPE_CHECKING:
    class _CredentialsFields(NamedTuple):
        access_key: str
        secret_key: str
        token: str | None
else:
    _CredentialsFields = namedtuple("Credentials", ("access_key", "secret_key", "token"))


class Credentials(_CredentialsFields):
    __slots__ = ()


if TYPE_CHECKING:
    class _TargetFields(NamedTuple):
        endpoint: str  # scheme://host[:port][/path]
        region: str
        # Called before every attempt: refreshable credentials (SnapStart's, a container's) change under a client.
        # None: there are none to sign with. It may raise: the source could not get them.
        credentials: Callable[[], Credentials | None]
        cafile: str | None = None  # for https: the CA bundle to trust (None: OpenSSL's defaults)
        proxy: str | None = None  # an http:// proxy URL
        tcp_keepalive: bool = False
        source: str = "environment"  # which source resolved it: "environment" or "botocore"
        # True when `credentials()` may wait on the network now (a refresh is due): the client then bounds it by
        # the attempt's time
        may_wait: Callable[[], bool] | None = None
else:
    _TargetFields = namedtuple("Target", (
        "endpoint",
        "region",
        "credentials",
        "cafile",
        "proxy",
        "tcp_keepalive",
        "source",
        "may_wait",
    ), defaults=(None, None, False, "environment", None))


class Target(_TargetFields):
    __slots__ = ()
