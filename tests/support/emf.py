"""A checker of the CloudWatch embedded metric format (EMF) specification's rules, for the documents the layer
writes (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html).

`check(line)` raises `EmfError` naming the first rule a log line breaks; tests/unit/test_metrics_documents.py
proves that it rejects each broken rule. It checks the layer's documents strictly: members the specification
defines only, no others in `_aws` or in a directive.
"""

from __future__ import annotations

import json
import math
from typing import Any

UNITS = frozenset({
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes", "Bits",
    "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second", "Kilobytes/Second",
    "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second", "Kilobits/Second", "Megabits/Second",
    "Gigabits/Second", "Terabits/Second", "Count/Second", "None",
})
MAX_DIMENSIONS = 30  # per DimensionSet
MAX_METRICS = 100  # MetricDefinitions per directive
MAX_VALUES = 100  # numbers in one metric's array
MAX_EVENT_BYTES = 256 * 1024  # a CloudWatch Logs event (the smaller of the limits AWS has stated)
MAX_DIMENSION_VALUE = 1024


class EmfError(ValueError):
    pass


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check(line: str) -> dict[str, Any]:
    """The document `line` holds, after checking it against the specification's rules."""
    if len(line.encode()) > MAX_EVENT_BYTES:
        raise EmfError(f"the log event is {len(line.encode())} bytes, over {MAX_EVENT_BYTES}")
    if "\n" in line.strip():
        raise EmfError("the document spans more than one line")
    try:
        doc = json.loads(line)
    except ValueError as error:
        raise EmfError(f"not JSON: {error}") from None
    if not isinstance(doc, dict):
        raise EmfError("the root is not a JSON object")
    meta = doc.get("_aws")
    if not isinstance(meta, dict):
        raise EmfError("no _aws metadata object at the root")
    if set(meta) - {"Timestamp", "CloudWatchMetrics"}:
        raise EmfError(f"_aws has members this checker does not know: {sorted(set(meta))}")
    stamp = meta.get("Timestamp")
    if not isinstance(stamp, int) or isinstance(stamp, bool) or stamp < 0:
        raise EmfError("_aws.Timestamp is missing or not a whole number of milliseconds since the epoch")
    directives = meta.get("CloudWatchMetrics")
    if not isinstance(directives, list) or not directives:
        raise EmfError("_aws.CloudWatchMetrics is missing or not a non-empty array of MetricDirectives")
    for directive in directives:
        _directive(doc, directive)
    return doc


def _directive(doc: dict[str, Any], directive: Any) -> None:
    if not isinstance(directive, dict):
        raise EmfError("a MetricDirective is not an object")
    if set(directive) - {"Namespace", "Dimensions", "Metrics"}:
        raise EmfError(f"a MetricDirective has members the specification does not define: {sorted(set(directive))}")
    namespace = directive.get("Namespace")
    if not isinstance(namespace, str) or not 1 <= len(namespace) <= 255:
        raise EmfError("Namespace is missing or not a string of 1 to 255 characters")
    dimensions = directive.get("Dimensions")
    if not isinstance(dimensions, list):
        raise EmfError("Dimensions is missing or not an array of DimensionSets")
    for dimension_set in dimensions:
        if not isinstance(dimension_set, list):
            raise EmfError("a DimensionSet is not an array")
        if len(dimension_set) > MAX_DIMENSIONS:
            raise EmfError(f"a DimensionSet has {len(dimension_set)} dimensions, over {MAX_DIMENSIONS}")
        if len(set(map(str, dimension_set))) != len(dimension_set):
            raise EmfError("a DimensionSet names a dimension twice")
        for name in dimension_set:
            if not isinstance(name, str) or not name:
                raise EmfError("a dimension name is not a non-empty string")
            value = doc.get(name)
            if not isinstance(value, str):
                raise EmfError(f"dimension {name!r} has no string member at the root")
            if not value.strip() or len(value) > MAX_DIMENSION_VALUE:
                raise EmfError(f"dimension {name!r} has a value that is blank or over {MAX_DIMENSION_VALUE} characters")
    metrics = directive.get("Metrics")
    if not isinstance(metrics, list):
        raise EmfError("Metrics is missing or not an array of MetricDefinitions")
    if len(metrics) > MAX_METRICS:
        raise EmfError(f"{len(metrics)} MetricDefinitions, over {MAX_METRICS}")
    names = set()
    for definition in metrics:
        if not isinstance(definition, dict) or set(definition) - {"Name", "Unit", "StorageResolution"}:
            raise EmfError("a MetricDefinition is not an object of Name, Unit and StorageResolution")
        name = definition.get("Name")
        if not isinstance(name, str) or not 1 <= len(name) <= 1024:
            raise EmfError("a MetricDefinition has no Name of 1 to 1024 characters")
        if name in names:
            raise EmfError(f"metric {name!r} is defined twice")
        names.add(name)
        if "Unit" in definition and definition["Unit"] not in UNITS:
            raise EmfError(f"metric {name!r} has unit {definition['Unit']!r}, not one of CloudWatch's")
        if "StorageResolution" in definition and definition["StorageResolution"] not in (1, 60):
            raise EmfError(f"metric {name!r} has StorageResolution {definition['StorageResolution']!r}, not 1 or 60")
        if name not in doc:
            raise EmfError(f"metric {name!r} has no member at the root")
        value = doc[name]
        if isinstance(value, list):
            if not value or len(value) > MAX_VALUES or not all(_number(v) for v in value):
                raise EmfError(f"metric {name!r} is an array that is empty, over {MAX_VALUES} values or not numbers")
        elif not _number(value):
            raise EmfError(f"metric {name!r} is not a number or an array of numbers")
        if name in {n for dimension_set in directive["Dimensions"] for n in dimension_set}:
            raise EmfError(f"{name!r} is both a dimension and a metric")


def documents(text: str) -> list[dict[str, Any]]:
    """Every EMF document among the lines of `text` (a line that has an `_aws` member), each checked."""
    found = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("{") and '"_aws"' in stripped:
            found.append(check(stripped))
    return found
