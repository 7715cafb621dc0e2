"""End to end: the same function under the Runtime Interface Emulator, with and without the layer.

Two execution environments run side by side (tests/support/rie.py: RIE in front of awslambdaric, started
through the stand-in for the managed runtime's bootstrap; the layer is the built zip unpacked into a stand-in
/opt and attached with AWS_LAMBDA_EXEC_WRAPPER). Batches of invocations alternate between them. Per path:
the median and p95 wall time of an invocation as the caller sees it (one HTTP request to RIE), and the runtime
process's CPU per invocation: utime + stime from /proc/<pid>/stat over all measured invocations, divided by
their number (clock ticks of 10 ms, so the figure is a mean and carries about +-10 ms / N of resolution).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from common import BENCH, CREDENTIALS, event, layer_env
from stats import median_ms, percentile_ms

BATCH = 10
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def runtime_pid(rie_pid: int) -> int:
    """The Python runtime process under RIE: the descendant running bootstrap.py (the wrapper execs into it)."""
    for pid in _descendants(rie_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"bootstrap.py") for arg in argv):
            return pid
    raise RuntimeError(f"no runtime process under RIE pid {rie_pid}")


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat(5))


def _python(runtimes: dict[str, Path]) -> tuple[str, Path]:
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    version = here if here in runtimes else sorted(runtimes)[-1]
    return version, runtimes[version]


def _versions(python: Path) -> dict[str, str]:
    import subprocess

    code = ("import platform; from importlib.metadata import version as v; print(platform.python_version(), "
            "*(v(p) for p in ('awslambdaric', 'boto3', 'botocore', 'urllib3', 'simplejson')))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return dict(zip(("python", "awslambdaric", "boto3", "botocore", "urllib3", "simplejson"), out, strict=True))


def measure(iterations: int, proxy: Any, ddb_endpoint: str, tmp: Path) -> dict[str, Any]:
    from tests.support import downloads

    try:
        from tests.support.rie import LambdaEnvironment, ensure_layer, unpack_layer
    except ImportError as error:  # the harness is not in this checkout
        return {"skipped": f"tests/support/rie.py is unavailable ({error})"}
    runtimes = downloads.runtimes()
    if not runtimes:
        return {"skipped": "no Python runtime venv (tests.support.downloads.runtimes() found none)"}
    version, python = _python(runtimes)
    opt = unpack_layer(ensure_layer(), tmp / "e2e-opt")
    task = tmp / "e2e-task"
    task.mkdir(exist_ok=True)
    shutil.copy(BENCH / "bench_handler.py", task)
    table = "bench-layer"  # the in-process layer's table: its keys here are in their own namespace
    settings = {**CREDENTIALS, **layer_env(table, proxy.endpoint)}
    settings.pop("IDEMPOTENCY_ORIGINAL_HANDLER")  # the wrapper sets it from _HANDLER
    plain = {**CREDENTIALS, "AWS_ENDPOINT_URL_DYNAMODB": proxy.endpoint}
    functions = {
        "with layer": LambdaEnvironment(python, task, version=version, handler="bench_handler.handler",
                                        env=settings, opt_dir=opt, wrapper=True, function_name="bench",
                                        log_path=tmp / "rie-layer.log"),
        "without layer": LambdaEnvironment(python, task, version=version, handler="bench_handler.handler",
                                           env=plain, wrapper=False, function_name="bench",
                                           log_path=tmp / "rie-bare.log"),
    }
    rows = []
    try:
        for function in functions.values():
            function.start()
        pids = {}
        for name, function in functions.items():
            answer = function.invoke(event("e2e-init", 0))  # init happens on the first invoke
            if answer.status != 200 or answer.error_type:
                raise RuntimeError(f"{name}: {answer.status} {answer.body[:500]!r}\n{function.logs()[-3000:]}")
            pids[name] = runtime_pid(function.process.pid)  # type: ignore[union-attr]
        warmup = max(BATCH, iterations // 5)
        for label, namespace in (("first execution", "e2e"), ("replay", "e2e")):
            walls: dict[str, list[int]] = {name: [] for name in functions}
            ticks = dict.fromkeys(functions, 0)
            requests = dict.fromkeys(functions, 0)
            wrong = dict.fromkeys(functions, 0)
            # Warm-up keys are their own (prefix "w"), so the replay path replays its own warm-up too.
            for phase, count in (("w", warmup), ("", iterations)):
                for number, start in enumerate(range(0, count, BATCH)):
                    order = list(functions) if number % 2 == 0 else list(functions)[::-1]
                    for name in order:
                        function, pid = functions[name], pids[name]
                        proxy.reset()
                        before = cpu_ticks(pid)
                        for index in range(start, min(start + BATCH, count)):
                            ev = event(phase + namespace, index)
                            started = time.perf_counter_ns()
                            answer = function.invoke(ev)
                            elapsed = time.perf_counter_ns() - started
                            expected = {"orderId": ev["orderId"], "status": "placed", "lines": []}
                            if phase == "":
                                walls[name].append(elapsed)
                                wrong[name] += answer.status != 200 or json.loads(answer.body) != expected
                        if phase == "":
                            ticks[name] += cpu_ticks(pid) - before
                            requests[name] += proxy.total()
            for name in functions:
                n = len(walls[name])
                rows.append({"label": label, "function": name, "n": n, "wall_p50_ms": median_ms(walls[name]),
                             "wall_p95_ms": percentile_ms(walls[name], 95),
                             "runtime_cpu_ms": ticks[name] * TICK_MS / n, "requests": requests[name] / n,
                             "wrong_results": wrong[name]})
    finally:
        for function in functions.values():
            function.stop()
    return {
        "note": f"Python {version} runtime venv, awslambdaric under RIE; {iterations} per path and function after "
                f"{warmup} warm-up, alternating batches of {BATCH}; runtime CPU is a mean over all of them",
        "runtime": _versions(python),
        "rows": rows,
    }
