"""The layer's logger.

Inside the Lambda runtime the root logger already has the runtime's handler, which writes one JSON object
a line under `AWS_LAMBDA_LOG_FORMAT=JSON`, extra fields included; the layer's records go through it.
Outside it (local runs, tests) the layer adds a handler of its own that follows the same setting.
"""

from __future__ import annotations

import logging
import os
import sys

import orjson

LOGGER_NAME = "idempotency_layer"


class _JsonFormatter(logging.Formatter):
    _STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "timestamp": self.formatTime(record, "%Y-%m-%dT%H:%M:%SZ"),
            "level": record.levelname,
            "message": record.getMessage(),
            "logger": record.name,
        }
        entry.update((k, v) for k, v in vars(record).items() if k not in self._STANDARD)
        if record.exc_info:
            entry["errorType"] = record.exc_info[0].__name__ if record.exc_info[0] else None
            entry["stackTrace"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


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
