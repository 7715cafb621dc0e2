"""A slice of the Valkey soak (`./build.sh chaos --valkey`, tools/valkey_soak.py) in every test run: a few hundred
invocations with duplicates against a real Valkey 9 server with an fsynced append-only file, behind the RESP fault
proxy (a reset before a command runs, `-LOADING`; after it was sent, answers dropped, cut part way, delayed),
environments SIGKILLed mid-invocation, keys overrunning the timeout, half the clocks 0.5 s ahead, and the server
itself SIGKILLed and started again twice during the run, down half a second each time; and not one key run twice,
re-run too early, answered two ways, lost or left stuck, nor one completed record forgotten by a restart. The
faults are counted by the proxy, the restarts by the server (its run id, the records it holds) and the proxy (the
commands the restarts broke, the scripts sent again), the kills by the soak's killer: none by the layer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.support.resp_fault_proxy import KINDS
from tools.chaos import Settings
from tools.valkey_soak import ValkeySettings, report_lines, soak

# The timeout is at least 4 s, raised by the soak to hold the slow keys' 2 s, a reserve derived from the invocation
# times it measures at the start and what a restart (measured once before the run) may add (tools/valkey_soak.py).
SLICE = Settings(invocations=400, duplicates=0.3, fault_rate=0.12, kill_rate=0.05, environments=4, seed=12, timeout=4,
                 skew_s=0.5, overrun=0.05)
VALKEY = ValkeySettings(server="valkey9", persistence="always", restarts=2)
ZEROS = ("doubles", "early", "divergent", "lost", "stuck", "unexpected", "records_lost_in_restarts")


def test_a_valkey_soak_slice_with_faults_kills_and_restarts_runs_every_key_once(opt_dir: Path, primary: str,
                                                                               tmp_path: Path) -> None:
    report = soak(replace(SLICE, python=primary), VALKEY, work=tmp_path / "soak", opt_dir=opt_dir,
                  say=lambda line: None)
    print("\n" + "\n".join(report_lines(report)))
    figures: dict[str, Any] = report["figures"]
    server = figures["server"]
    # The server was really restarted twice during the run: a new process each time (its run id), holding every
    # record it had completed before (read from it before and after), and forgetting its scripts (the layer sent
    # them whole again, as the proxy saw); and once before the run, keeping a record written just before.
    assert server["restarts"] == 2 and server["restarts_run_id_changed"] == 2, report["restarts"]
    assert server["completed_before_restarts"] >= 100 and server["records_lost_in_restarts"] == 0, report["restarts"]
    assert server["scripts_sent_whole"] >= 2 and server["restart_probe"]["probe_record_kept"], server
    assert server["commands_broken_by_restarts"] >= 1, server  # commands the server went away with, or refused
    # Every fault kind, counted by the proxy; kills, counted by the killer.
    assert all(figures["faults"][kind] >= 3 for kind in KINDS), figures["faults"]
    assert figures["kills"] >= 3 and figures["kills_after_side_effect"] >= 1, figures
    # Keys overran the timeout (a kill may come first), and others worked seconds every time.
    assert figures["overrun_keys"] >= 5 and figures["timeouts_after_side_effect"] >= 3 and figures["slow_keys"] >= 3
    # The skew really applied: the handlers in skewed environments saw the time about 0.5 s ahead.
    offsets = figures["clock_offset_ms"]
    assert 400 < offsets["skewed"] - offsets["others"] < 700, offsets
    assert figures["duplicates"] == 120 and figures["answers"]["ok"] == 400
    # The timeout was fitted to what the probe measured, and held.
    timing = figures["timing"]
    assert timing["probe"] is not None and timing["timeout_s"] >= timing["longest_work_s"] + timing["reserve_s"], timing
    assert figures["margin_timeouts"] == 0, timing
    zeros = {name: figures[name] for name in ZEROS}
    assert zeros == dict.fromkeys(ZEROS, 0), report["histories"]
    assert figures["completed_records"] == figures["keys"]  # read from the server after its restarts
    assert report["passed"], report["failed"]
