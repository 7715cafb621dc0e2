"""The README's Operations section names exactly the metrics and outcomes the layer writes."""

from __future__ import annotations

import re
from pathlib import Path

from idempotency_layer import metrics

ROOT = Path(__file__).resolve().parents[2]


def _section(text: str, title: str) -> str:
    start = text.index(f"### {title}\n")
    end = text.find("\n### ", start + 1)
    return text[start:end]


def test_the_readme_lists_every_metric_and_no_other():
    section = _section((ROOT / "README.md").read_text(), "Metrics and logs")
    counts = section[section.index("counts\n"):section.index("counts that are zero")]  # the list after "counts"
    assert set(re.findall(r"`([A-Z][A-Za-z]+)`", counts)) == {*metrics.COUNTS, "Invocations", "Records", "StoreTime"}
    sources = ", ".join(f"`{source}`" for source in metrics.SOURCES)
    assert f"`{metrics.DIMENSIONS[0]}` and `{metrics.DIMENSIONS[1]}` ({sources})" in section


def test_the_metrics_doc_has_a_row_for_every_metric():
    rows = set(re.findall(r"^\| `([A-Za-z]+)` \|", (ROOT / "docs" / "metrics-and-logs.md").read_text(), re.M))
    assert rows >= {*metrics.COUNTS, "Invocations", "Records", "StoreTime"}


def test_the_readme_lists_every_outcome_and_no_other():
    section = _section((ROOT / "README.md").read_text(), "Metrics and logs")
    listed = section[section.index("`idempotency_outcome` (") + len("`idempotency_outcome` ("):].split(")")[0]
    assert set(re.findall(r"`([a-z_]+)`", listed)) == set(metrics._OUTCOMES)
