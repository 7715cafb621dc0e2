"""log.py outside the runtime: its own JSON formatter writes the key fields as the runtime's does (None left out),
and a record made with `fields` carries them."""

from __future__ import annotations

import json
import logging

from awslambdaric.lambda_runtime_log_utils import JsonFormatter as RuntimeFormatter

from idempotency_layer import log


def _record(**extra: object) -> logging.LogRecord:
    logger = logging.getLogger("idempotency_layer.test")
    return logger.makeRecord(logger.name, logging.WARNING, __file__, 1, "claim on key %r gone", ("fn#ab",), None,
                             extra=extra)


def test_our_formatter_and_the_runtimes_write_the_same_fields():
    record = _record(**log.fields("fn#ab", "released"))
    ours = json.loads(log._JsonFormatter().format(record))
    theirs = json.loads(RuntimeFormatter().format(_record(**log.fields("fn#ab", "released"))))
    for entry in (ours, theirs):
        assert entry["idempotency_key"] == "fn#ab" and entry["idempotency_outcome"] == "released"
        assert entry["message"] == "claim on key 'fn#ab' gone"


def test_an_unknown_outcome_or_key_is_left_out():
    for formatter in (log._JsonFormatter(), RuntimeFormatter()):
        entry = json.loads(formatter.format(_record(**log.fields(None))))
        assert "idempotency_key" not in entry and "idempotency_outcome" not in entry
        entry = json.loads(formatter.format(_record(**log.fields("fn#cd"))))
        assert entry["idempotency_key"] == "fn#cd" and "idempotency_outcome" not in entry
