"""End to end: the same function under the Runtime Interface Emulator, bare, with the layer, and with Powertools.

Three execution environments run side by side (tests/support/rie.py: RIE in front of awslambdaric, started
through the stand-in for the managed runtime's bootstrap): "without layer" (the bench handler alone), "with
layer" (the built zip unpacked into a stand-in /opt and attached with AWS_LAMBDA_EXEC_WRAPPER) and "powertools"
(the bench handler under Powertools' `@idempotent` with `DynamoDBPersistenceLayer`, bench/powertools_handler.py,
configured as the in-process and init rows configure it, on a table of its own; Powertools is not in the runtime
venv, so its installed package is copied into that function's task root, as a function would bundle it).
Batches of invocations go to each in turn, the order rotated per batch. Per path: the median and p95 wall time
of an invocation as the caller sees it (one HTTP request to RIE), the requests the counting proxy saw, and the
runtime process's CPU per invocation: the first field of /proc/<pid>/task/*/schedstat (nanoseconds on CPU),
summed over the runtime's threads, read before and after each batch once the runtime is idle again, over all
measured invocations divided by their number. utime + stime from /proc/<pid>/stat (clock ticks of 10 ms) is kept
beside it as a cross-check, and is the figure only where schedstat is unavailable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import BENCH, CREDENTIALS, E2E_POWERTOOLS_TABLE, event, layer_env
from stats import median_ms, percentile_ms

BATCH = 10
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
FUNCTIONS = ("without layer", "with layer", "powertools")


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
    """utime + stime of the whole process (its exited threads included), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat(5))


def schedstat_ns(pid: int) -> tuple[int, frozenset[int]]:
    """Nanoseconds on CPU summed over the process's live threads (schedstat's first field), and their ids.

    A thread that exits takes its figure with it: callers compare the ids before and after."""
    total, tids = 0, []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        tids.append(int(tid))
    return total, frozenset(tids)


def schedstat_works(pid: int) -> bool:
    """Whether schedstat counts this runtime's CPU: present, and non-zero for a process that has run."""
    try:
        return schedstat_ns(pid)[0] > 0
    except OSError:
        return False


def settled(pid: int, use_schedstat: bool) -> tuple[int, int, frozenset[int]]:
    """(schedstat ns, ticks, thread ids), read once the runtime has stopped running: RIE answers the caller as
    soon as the runtime posts the result, and the runtime goes on to ask for the next event after that."""
    previous = None
    for _ in range(50):
        ns, tids = schedstat_ns(pid) if use_schedstat else (0, frozenset())
        now = (ns, cpu_ticks(pid), tids)
        if now == previous:
            return now
        previous = now
        time.sleep(0.001)
    assert previous is not None
    return previous


def _python(runtimes: dict[str, Path]) -> tuple[str, Path]:
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    version = here if here in runtimes else sorted(runtimes)[-1]
    return version, runtimes[version]


def _versions(python: Path, task: Path) -> dict[str, str]:
    packages = ("awslambdaric", "boto3", "botocore", "urllib3", "simplejson", "aws-lambda-powertools")
    code = ("import sys, platform; from importlib.metadata import version as v; sys.path.insert(0, sys.argv[1]); "
            f"print(platform.python_version(), *(v(p) for p in {packages!r}))")
    out = subprocess.run([str(python), "-c", code, str(task)], capture_output=True, text=True,
                         check=True).stdout.split()
    return dict(zip(("python", *packages), out, strict=True))


def _importable(python: Path, module: str, first: Path | None = None) -> bool:
    """Whether `python` imports `module`, with `first` (a task root) at the front of its path."""
    code = f"import sys; sys.path.insert(0, {str(first)!r}); import {module}" if first else f"import {module}"
    return subprocess.run([str(python), "-c", code], capture_output=True).returncode == 0


def powertools_task(python: Path, task: Path) -> str:
    """A task root with the bench handler, its Powertools wrapper, and Powertools if the runtime lacks it.

    Powertools (pure Python) and its one dependency the runtime venv lacks (typing_extensions; jmespath comes
    with boto3) are copied from this venv's site-packages, .pyc and dist-info included, as pip would install
    them into a function's package. Says where Powertools comes from."""
    task.mkdir(exist_ok=True)
    for name in ("bench_handler.py", "common.py", "powertools_handler.py"):
        shutil.copy(BENCH / name, task)
    if _importable(python, "aws_lambda_powertools"):
        return "the runtime venv's"
    import aws_lambda_powertools
    import typing_extensions

    site = Path(aws_lambda_powertools.__file__).parent.parent
    for entry in site.iterdir():
        if entry.name == "aws_lambda_powertools" or entry.name.startswith(("aws_lambda_powertools-",
                                                                         "typing_extensions-")):
            shutil.copytree(entry, task / entry.name, dirs_exist_ok=True)
    shutil.copy(typing_extensions.__file__, task)
    missing = [m for m in ("aws_lambda_powertools.utilities.idempotency", "jmespath", "typing_extensions")
               if not _importable(python, m, task)]
    if missing:
        raise RuntimeError(f"the Powertools function's task root does not provide {missing} to {python}")
    return "copied from the bench venv into the function's task root"


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
    pt_task = tmp / "e2e-task-powertools"
    powertools_from = powertools_task(python, pt_task)
    table = "bench-layer"  # the in-process layer's table: its keys here are in their own namespace
    settings = {**CREDENTIALS, **layer_env(table, proxy.endpoint)}
    settings.pop("IDEMPOTENCY_ORIGINAL_HANDLER")  # the wrapper sets it from _HANDLER
    plain = {**CREDENTIALS, "AWS_ENDPOINT_URL_DYNAMODB": proxy.endpoint}
    functions = {
        "without layer": LambdaEnvironment(python, task, version=version, handler="bench_handler.handler",
                                           env=plain, wrapper=False, function_name="bench",
                                           log_path=tmp / "rie-bare.log"),
        "with layer": LambdaEnvironment(python, task, version=version, handler="bench_handler.handler",
                                        env=settings, opt_dir=opt, wrapper=True, function_name="bench",
                                        log_path=tmp / "rie-layer.log"),
        "powertools": LambdaEnvironment(python, pt_task, version=version, handler="powertools_handler.handler",
                                        env={**plain, "BENCH_TABLE": E2E_POWERTOOLS_TABLE}, wrapper=False,
                                        function_name="bench", log_path=tmp / "rie-powertools.log"),
    }
    names = list(functions)
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
        use_schedstat = all(schedstat_works(pid) for pid in pids.values())
        warmup = max(BATCH, iterations // 5)
        for label, namespace in (("first execution", "e2e"), ("replay", "e2e")):
            walls: dict[str, list[int]] = {name: [] for name in functions}
            cpu_ns = dict.fromkeys(functions, 0)
            ticks = dict.fromkeys(functions, 0)
            requests: dict[str, Counter[str]] = {name: Counter() for name in functions}
            wrong = dict.fromkeys(functions, 0)
            threads: dict[str, set[int]] = {name: set() for name in functions}
            thread_changes = dict.fromkeys(functions, 0)
            # Warm-up keys are their own (prefix "w"), so the replay path replays its own warm-up too.
            for phase, count in (("w", warmup), ("", iterations)):
                for number, start in enumerate(range(0, count, BATCH)):
                    turn = number % len(names)
                    for name in names[turn:] + names[:turn]:
                        function, pid = functions[name], pids[name]
                        proxy.reset()
                        ns0, ticks0, tids0 = settled(pid, use_schedstat)
                        for index in range(start, min(start + BATCH, count)):
                            ev = event(phase + namespace, index)
                            started = time.perf_counter_ns()
                            answer = function.invoke(ev)
                            elapsed = time.perf_counter_ns() - started
                            expected = {"orderId": ev["orderId"], "status": "placed", "lines": []}
                            if phase == "":
                                walls[name].append(elapsed)
                                wrong[name] += answer.status != 200 or json.loads(answer.body) != expected
                        ns1, ticks1, tids1 = settled(pid, use_schedstat)
                        if phase == "":
                            cpu_ns[name] += ns1 - ns0
                            ticks[name] += ticks1 - ticks0
                            requests[name].update(proxy.snapshot()[0])
                            threads[name] |= tids0 | tids1
                            thread_changes[name] += tids0 != tids1
            for name in functions:
                n = len(walls[name])
                ticks_ms = ticks[name] * TICK_MS / n
                rows.append({"label": label, "function": name, "n": n, "wall_p50_ms": median_ms(walls[name]),
                             "wall_p95_ms": percentile_ms(walls[name], 95),
                             "runtime_cpu_ms": cpu_ns[name] / 1e6 / n if use_schedstat else ticks_ms,
                             "runtime_cpu_ticks_ms": ticks_ms,
                             "requests": sum(requests[name].values()) / n,
                             "requests_by_op": {op: c / n for op, c in sorted(requests[name].items())},
                             "threads": len(threads[name]), "batches_threads_changed": thread_changes[name],
                             "wrong_results": wrong[name]})
    finally:
        for function in functions.values():
            function.stop()
    cpu_source = ("schedstat (ns on CPU, summed over the runtime's threads)" if use_schedstat
                  else "utime + stime clock ticks (schedstat unavailable)")
    return {
        "note": f"Python {version} runtime venv, awslambdaric under RIE; {iterations} per path and function after "
                f"{warmup} warm-up, batches of {BATCH} rotated over the functions; runtime CPU is a mean over all "
                f"of them, from {cpu_source}",
        "cpu_source": "schedstat" if use_schedstat else "ticks",
        "powertools_from": powertools_from,
        "powertools_table": E2E_POWERTOOLS_TABLE,
        "runtime": _versions(python, pt_task),
        "rows": rows,
    }
