"""The Valkey / Redis OSS store (IDEMPOTENCY_STORE=valkey): ElastiCache, MemoryDB, or any server of the protocol.

    store      the record protocol as Lua scripts (the cycle's `store.Store`)
    auth       what new connections authenticate with: the URL's password, a secret, an IAM token
    client     commands within a deadline: routing (cluster mode), the retry rule, TLS, the error model
    resp       RESP2 framing on one socket

Imported only when this store is chosen: valkey-py, which it runs on, costs its import time then and only then.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from ...config import Config
    from .store import ValkeyStore


def make_store(config: Config) -> ValkeyStore:
    from .auth import Auth
    from .client import Client
    from .store import ValkeyStore

    url = config.valkey
    assert url is not None
    auth = Auth(url, connect_timeout=config.connect_timeout, read_timeout=config.read_timeout)
    return ValkeyStore(Client(url, connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
                              max_attempts=config.max_attempts, auth=auth))
