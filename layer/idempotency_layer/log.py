"""The layer's logger.

Inside the Lambda runtime the root logger already has the runtime's handler, which writes one JSON object
a line under `AWS_LAMBDA_LOG_FORMAT=JSON`, extra fields included; the layer's records go through it.
Outside it (local runs, tests) the layer adds a handler of its own that follows the same setting.

Every record about a key carries it as `idempotency_key` (the stored, hashed key) and, where known,
`idempotency_outcome` (`fields`): under JSON both formatters write them as fields of the line.
"""

from __future__ import annotations

import logging
import os
import sys

import orjson

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

LOGGER_NAME = "idempotency_layer"


class _JsonFormatter(logging.Formatter):
    _STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": self.formatTime(record, "%Y-%m-%dT%H:%M:%SZ"),
            "level": record.levelname,
            "message": record.getMessage(),
            "logger": record.name,
        }
        # None dropped, as the runtime's formatter does
        entry.update((k, v) for k, v in vars(record).items() if k not in self._STANDARD and v is not None)
        if record.exc_info:
            entry["errorType"] = record.exc_info[0].__name__ if record.exc_info[0] else None
            entry["stackTrace"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def fields(key: str | None, outcome: str | None = None) -> dict[str, str | None]:
    """The `extra` of a record about `key`: JSON formatters write each as a field of the line."""
    return {"idempotency_key": key, "idempotency_outcome": outcome}


def setup(level: str) -> logging.Logger:
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        if os.environ.get("AWS_LAMBDA_LOG_FORMAT", "").upper() == "JSON":
            handler.setFormatter(_JsonFormatter())
        else:
            handler.setFormatter(logging.Formatter("[%(levelname)s] %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    return logger
