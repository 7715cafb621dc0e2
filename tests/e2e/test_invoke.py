"""`./build.sh invoke` (scripts/invoke.py, issue 29): a function that is not in the repository, run under the built
layer on this machine in one command; every process it starts is stopped when it ends, Ctrl-C included."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.rie import lambda_arch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "invoke.py"

HANDLER = '''
import json, os, time

def handler(event, context):
    time.sleep(float(os.environ.get("SLEEP_S", "0")))
    with open(os.environ["CHARGES_FILE"], "a") as charges:
        charges.write(json.dumps({"paymentId": event["paymentId"]}) + "\\n")
    print("charged", event["paymentId"])
    return {"charged": event["amount"], "at": time.time()}
'''


@pytest.fixture
def function(tmp_path: Path, opt_dir: Path) -> dict[str, Path]:
    # opt_dir: the session's build, so dist/ holds this machine's zip
    assert (ROOT / "dist" / f"idempotency-layer-{lambda_arch()}.zip").exists()
    code = tmp_path / "my-function"
    code.mkdir()
    (code / "payments.py").write_text(HANDLER)
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"paymentId": "p-1", "amount": 42, "requestedAt": "10:00"}))
    return {"code": code, "event": event, "charges": tmp_path / "charges.log"}


def invoke(function: dict[str, Path], *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--code", str(function["code"]), "--handler", "payments.handler",
            "--event", str(function["event"]), "--env", f"CHARGES_FILE={function['charges']}", *extra]


def started(output: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"\(pid (\d+)\)", output)]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # a zombie is not running


def test_your_function_runs_once_and_replays_with_everything_said(function: dict[str, Path]) -> None:
    done = subprocess.run(invoke(function, "--times", "3", "--env", "IDEMPOTENCY_KEY_JMESPATH=paymentId"),
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert function["charges"].read_text().count("\n") == 1  # the handler's own side effect: it ran once
    answers = re.findall(r"^  answer: (.*)$", out, re.M)
    assert len(answers) == 3 and len(set(answers)) == 1 and json.loads(answers[0])["charged"] == 42
    assert out.count("  the function wrote:\n    charged p-1\n") == 1 and out.count("the function wrote nothing") == 2
    assert len(re.findall(r"^  layer: INFO .*\[first_run\]$", out, re.M)) == 1
    assert len(re.findall(r"^  layer: INFO .*replay of the stored result.*\[replay\]$", out, re.M)) == 2
    assert re.search(r"^status: +COMPLETED \(completed: copies replay the stored result\)$", out, re.M)
    pids = started(out)
    assert len(pids) == 2 and all(gone(pid) for pid in pids)


def test_ctrl_c_stops_everything_it_started(function: dict[str, Path]) -> None:
    process = subprocess.Popen(invoke(function, "--env", "SLEEP_S=60"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not any(line.startswith("the emulator at") for line in lines):
        assert process.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.1)
    time.sleep(1)  # the invocation is sent, the handler asleep
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    reader.join(timeout=10)
    assert process.returncode == 130, err
    assert "interrupted; everything it started is stopped" in err
    pids = started("".join(lines))
    assert len(pids) == 2 and all(gone(pid) for pid in pids)
    assert not function["charges"].exists()  # interrupted in its sleep


@pytest.mark.parametrize(("change", "said"), [
    ({"--handler": "payments"}, "--handler 'payments' is not MODULE.FUNCTION"),
    ({"--times": "0"}, "--times 0 is not from 1 to 100"),
    ({"--env": "NOEQUALS"}, "--env 'NOEQUALS' is not NAME=VALUE"),
    ({"--timeout": "0"}, "--timeout 0 is not from 1 to 900 seconds (Lambda's range)"),
])
def test_a_bad_option_is_exit_2_naming_it(function: dict[str, Path], change: dict[str, str], said: str) -> None:
    arguments = invoke(function)
    for option, value in change.items():
        arguments += [option, value]
    done = subprocess.run(arguments, capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (2, f"./build.sh invoke: {said}\n")


def test_an_event_file_that_is_not_json_is_exit_2(function: dict[str, Path]) -> None:
    function["event"].write_text("{not json")
    done = subprocess.run(invoke(function), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "cannot be read as JSON" in done.stderr




def test_retries_that_differ_are_events_of_their_own_and_a_failure_is_exit_1(function: dict[str, Path],
                                                                               tmp_path: Path) -> None:
    retry = tmp_path / "retry.json"
    retry.write_text(json.dumps({"paymentId": "p-1", "amount": 42, "requestedAt": "10:05"}))
    done = subprocess.run(invoke(function, "--event", str(retry), "--times", "1", "--env",
                                 "IDEMPOTENCY_KEY_JMESPATH=paymentId"),
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert function["charges"].read_text().count("\n") == 1  # the retry with another timestamp replayed
    assert len(re.findall(r"^\S+retry\.json, invocation 1 of 1: HTTP 200", done.stdout, re.M)) == 1
    assert done.stdout.count("the record, as `idempotency-layer show --event") == 2
    failing = subprocess.run(invoke(function, "--times", "1", "--env", "IDEMPOTENCY_KEY_JMESPAHT=paymentId"),
                             capture_output=True, text=True, timeout=180, check=False)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "the function failed" in failing.stdout and "did you mean IDEMPOTENCY_KEY_JMESPATH?" in failing.stdout
