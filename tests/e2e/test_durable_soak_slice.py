"""A slice of the durable soak (`./build.sh chaos --durable`, tools/durable_soak.py) in every test run: orders
delivered up to three times as new durable executions (AWS's local runner invoking the SDK's workflow through the
emulator with the built layer), environments SIGKILLed mid-invocation, store faults; and not one order charged by
two executions, no delivery lost or answered another order's receipt, nothing left in progress. The verdict
comes from the workflow's own ledger and the runner's word on each execution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_durable_execution_sdk_python")  # Python 3.11+

from tools.durable_soak import Settings, report_lines, soak

SLICE = Settings(orders=40, duplicates=0.6, kill_rate=0.2, fault_rate=0.05, environments=3, seed=11, rate=5.0)


def test_a_durable_soak_slice_runs_each_order_in_one_execution(dynamodb: Any, opt_dir: Path, primary: str,
                                                               tmp_path: Path) -> None:
    if tuple(map(int, primary.split("."))) < (3, 11):
        pytest.skip("AWS's durable execution SDK needs Python 3.11+")
    report = soak(SLICE, work=tmp_path / "soak", dynamodb_endpoint=dynamodb.endpoint, opt_dir=opt_dir,
                  say=lambda line: None)
    print("\n" + "\n".join(report_lines(report)))
    figures = report["figures"]
    assert figures["front"].get("kills", 0) >= 1  # environments really died mid-invocation
    assert figures["faults"] >= 1
    assert figures["duplicated_orders"] >= 10 and figures["ends"].get("in_progress", 0) >= 1  # duplicates met claims
    assert figures["ends"]["succeeded"] == figures["deliveries"]
    assert {name: figures[name] for name in ("doubles", "lost", "divergent", "unexpected", "stuck")} == dict.fromkeys(
        ("doubles", "lost", "divergent", "unexpected", "stuck"), 0)
    assert figures["records"] == SLICE.orders
    assert report["passed"]
