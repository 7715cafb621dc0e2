"""The durable soak's verdict (tools/durable_soak.py) from a ledger and the executions' ends: a workflow run by two
executions is a double, a step run again within one execution is not, a wrong receipt is divergent."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tools.durable_soak import Settings, verdict


class Ends:
    def __init__(self, plan, results, ends, lost=()):
        self.plan, self.results, self.ends, self.lost = plan, results, Counter(ends), list(lost)


def receipt(order: str) -> str:
    return json.dumps({"receipt": f"charged {order}"})


def test_the_verdict(tmp_path: Path):
    ledger = tmp_path / "ledger.txt"
    ledger.write_text("a arn-1\na arn-1\nb arn-2\nb arn-3\nc arn-4\n")  # a: a step again; b: two executions
    ends = Ends([(0, "a"), (0, "b"), (0, "c"), (1, "c")], {"a": [receipt("a")], "b": [receipt("b")],
                                                          "c": [receipt("c"), receipt("b")]},
                {"succeeded": 4, "in_progress": 2, "unexpected:FAILED:ValueError": 1}, lost=["d"])
    records = [{"status": {"S": "COMPLETED"}}, {"status": {"S": "INPROGRESS"}}]
    figures = verdict(Settings(orders=3), ledger, ends, records)
    assert figures["doubles"] == 1 and figures["double_orders"] == ["b"]
    assert figures["step_reruns"] == 1 and figures["charges"] == 5
    assert figures["divergent"] == 1 and figures["lost"] == 1 and figures["unexpected"] == 1
    assert figures["stuck"] == 1 and figures["duplicated_orders"] == 1
