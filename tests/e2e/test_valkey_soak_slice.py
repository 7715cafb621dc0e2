"""A slice of the Valkey soak (`./build.sh chaos --valkey`, tools/valkey_soak.py) in every test run: a few hundred
invocations with duplicates, the store's commands cut before they run, answered late or not at all after they
ran, environments SIGKILLed mid-invocation, keys overrunning the timeout, half the clocks ahead, and the Valkey
server itself killed and started again twice; and not one key run twice, re-run too early, answered two ways,
lost or left stuck. Faults, kills and restarts are counted by the proxy, the soak and the server, not the layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.chaos import Settings
from tools.valkey_soak import KINDS, ZEROS, report_lines, soak

SLICE = Settings(invocations=300, duplicates=0.3, fault_rate=0.12, kill_rate=0.05, environments=4, seed=11, timeout=6,
                 skew_s=0.5, overrun=0.03)


def test_a_valkey_soak_slice_with_faults_kills_and_restarts_runs_every_key_once(opt_dir: Path, primary: str,
                                                                               tmp_path: Path) -> None:
    from dataclasses import replace

    report = soak(replace(SLICE, python=primary), work=tmp_path / "soak", opt_dir=opt_dir, restarts=2)
    print("\n" + "\n".join(report_lines(report)))
    figures: dict[str, Any] = report["figures"]
    assert figures["restarts"] == 2, figures["restarted_at_s"]
    assert all(figures["faults"][kind] >= 3 for kind in KINDS), figures["faults"]
    assert figures["kills"] >= 3 and figures["timeouts"] >= 1, figures
    assert figures["duplicates"] == 90 and figures["answers"]["ok"] == 300
    zeros = {name: figures[name] for name in ZEROS}
    assert zeros == dict.fromkeys(ZEROS, 0), report["histories"]
    assert figures["completed_records"] == figures["keys"]  # read from the server after its restarts
