"""A Kafka consumer that, unlike AWS's documented one, goes on past a failed record and reports every record it
could not process. It knows nothing of the layer; lines in $EXECUTIONS_FILE count its executions."""

from __future__ import annotations

from typing import Any

from kafka_consumer import _process


def handler(event: dict[str, Any], context: Any) -> Any:
    failures = []
    for partition, records in event["records"].items():
        for record in records:
            try:
                _process(record)
            except Exception:
                failures.append({"itemIdentifier": {"partition": partition, "offset": record["offset"]}})
    return {"batchItemFailures": failures}
