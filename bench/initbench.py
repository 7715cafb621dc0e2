"""Init: fresh processes, from start to "ready for the first event", wall time, CPU and peak RSS (VmHWM).

- bare: Python starts and imports the handler module (the baseline every function pays);
- layer: Python starts and imports the interceptor, which reads its settings, builds its DynamoDB client and
  imports the handler module;
- powertools: Python starts, imports the handler module and Powertools' idempotency utility, constructs
  DynamoDBPersistenceLayer and decorates the handler.

Bytecode: the layer ships no .pyc (Lambda's /opt is read-only, so none can be written either), so its package is
copied without __pycache__ to a stand-in /opt/python, and every probe runs with PYTHONDONTWRITEBYTECODE=1.
boto3, botocore, urllib3 and jmespath keep their .pyc, as the managed runtime's do. The handler module, like
/var/task, has none. Powertools' own layer is built per Python version with pip, which compiles, and the layer
canary in its repository fails when imports recompile sources (an older layer Dockerfile deleted .pyc, so what a
given release ships is not verified here); so Powertools keeps its .pyc in the comparison (its better case) and
is measured without them too, for reference.
"""

from __future__ import annotations

import compileall
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from common import BENCH, KEY_JMESPATH, KEY_PREFIX, LAYER_SRC, TTL_SECONDS, base_env, layer_env, python

MB = 1024 * 1024
# Runs with -c, so sys.path[0] is the working directory: the stand-in /var/task. It reads the clocks and
# /proc before importing anything of its own (no json, no re), so it adds nothing to what it measures.
PROBE = """
import os, sys, time
kind = sys.argv[1]
if kind == "bare":
    import bench_handler
    handler = bench_handler.handler
elif kind == "layer":
    from idempotency_layer import interceptor
    handler = interceptor.handler
else:
    import bench_handler
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer, IdempotencyConfig, idempotent
    persistence = DynamoDBPersistenceLayer(table_name=os.environ["BENCH_TABLE"])
    config = IdempotencyConfig(event_key_jmespath=sys.argv[2], expires_after_seconds=int(sys.argv[3]),
                               raise_on_no_idempotency_key=False)
    handler = idempotent(persistence_store=persistence, config=config, key_prefix=sys.argv[4])(bench_handler.handler)
cpu = time.process_time()
hwm = rss = 0
with open("/proc/self/status") as status:
    for line in status:
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
        elif line.startswith("VmRSS:"):
            rss = int(line.split()[1])
print("ready", cpu, hwm, rss, flush=True)
# After the measurement: where the code came from, and whether any of it had bytecode.
def origin(name):
    module = sys.modules.get(name)
    if module is None:
        return "-"
    cached = getattr(module, "__cached__", None)
    return module.__file__ + ("|pyc" if cached and os.path.exists(cached) else "|source")
print(origin("idempotency_layer.interceptor"), origin("aws_lambda_powertools.utilities.idempotency"),
      origin("bench_handler"), origin("botocore.session"), flush=True)
"""

# Peak RSS after each step of the layer's imports, in order: which dependency the added megabytes come from.
RSS_STEPS = """
import sys
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
steps = [("python + handler module", "import bench_handler"), ("orjson", "import orjson"), ("ssl", "import ssl"),
         ("urllib3 (with http.client)", "import urllib3"),
         ("botocore auth, awsrequest, parsers, retries", "import botocore.auth, botocore.awsrequest, "
          "botocore.parsers, botocore.retries.standard"),
         ("botocore.session", "import botocore.session"), ("jmespath", "import jmespath"),
         ("the rest of the interceptor's init (config, transport, handler)", "import idempotency_layer.interceptor")]
for name, code in steps:
    exec(code)
    print(hwm(), name, sep="\t")
"""

VARIANTS = ("bare", "layer", "layer (.pyc)", "layer-boto3", "powertools", "powertools (no .pyc)")


def _copy_package(source: Path, target_root: Path) -> None:
    shutil.copytree(source, target_root / source.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _setup(tmp: Path) -> dict[str, Path]:
    import aws_lambda_powertools

    dirs = {"task": tmp / "var-task", "opt": tmp / "opt-python", "opt-pyc": tmp / "opt-python-pyc",
            "powertools": tmp / "powertools-nopyc"}
    for path in dirs.values():
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    shutil.copy(BENCH / "bench_handler.py", dirs["task"])
    _copy_package(LAYER_SRC / "idempotency_layer", dirs["opt"])
    # For reference only: what the layer's init would be if it could ship bytecode.
    _copy_package(LAYER_SRC / "idempotency_layer", dirs["opt-pyc"])
    compileall.compile_dir(dirs["opt-pyc"], quiet=1, force=True)
    _copy_package(Path(aws_lambda_powertools.__file__).parent, dirs["powertools"])
    return dirs


def _env(variant: str, endpoint: str, dirs: dict[str, Path]) -> dict[str, str]:
    env = base_env(endpoint)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONPATH", None)
    env["BENCH_TABLE"] = "bench-init"
    if variant.startswith("layer"):
        env.update(layer_env("bench-init", endpoint, "boto3" if variant == "layer-boto3" else "lean"))
        env["PYTHONPATH"] = str(dirs["opt-pyc" if variant == "layer (.pyc)" else "opt"])
    elif variant == "powertools (no .pyc)":
        env["PYTHONPATH"] = str(dirs["powertools"])
    return env


def _probe(variant: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    kind = "bare" if variant == "bare" else "layer" if variant.startswith("layer") else "powertools"
    started = time.perf_counter()
    argv = [python(), "-c", PROBE, kind, KEY_JMESPATH, str(TTL_SECONDS), KEY_PREFIX]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env, cwd=cwd, text=True)
    assert child.stdout is not None
    first = child.stdout.readline()
    wall = time.perf_counter() - started
    # Not communicate(): it reads the pipes' file descriptors and would miss what readline() has buffered.
    rest = child.stdout.read()
    errors = child.stderr.read() if child.stderr else ""
    child.wait(timeout=60)
    if not first.startswith("ready") or child.returncode != 0:
        raise RuntimeError(f"init probe {variant} failed ({child.returncode}): {first}{rest}{errors}")
    _, cpu, hwm, rss = first.split()
    return {"wall_ms": wall * 1000, "cpu_ms": float(cpu) * 1000, "hwm_mb": int(hwm) / 1024,
            "rss_mb": int(rss) / 1024, "origins": rest.split()}


def _importtime(env: dict[str, str], cwd: Path, runs: int = 3) -> list[dict[str, Any]]:
    """Top 10 cumulative import times of the interceptor, each module's median over `runs` runs."""
    seen: dict[str, list[tuple[int, int]]] = {}
    for _ in range(runs):
        done = subprocess.run([python(), "-X", "importtime", "-c", "import idempotency_layer.interceptor"],
                              env=env, cwd=cwd, capture_output=True, text=True, check=True)
        for line in done.stderr.splitlines():
            if not line.startswith("import time:") or "cumulative" in line:
                continue
            own, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
            seen.setdefault(name.strip(), []).append((int(own), int(cumulative)))
    rows = [{"module": name, "self_ms": statistics.median(o for o, _ in v) / 1000,
             "cumulative_ms": statistics.median(c for _, c in v) / 1000} for name, v in seen.items()]
    return sorted(rows, key=lambda r: -r["cumulative_ms"])[:10]


def _rss_steps(env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    done = subprocess.run([python(), "-c", RSS_STEPS], env=env, cwd=cwd, capture_output=True, text=True, check=True)
    rows, previous = [], None
    for line in done.stdout.splitlines():
        kb, name = line.split("\t", 1)
        mb = int(kb) / 1024
        rows.append({"step": name, "hwm_mb": mb, "added_mb": None if previous is None else mb - previous})
        previous = mb
    return rows


def measure(samples: int, endpoint: str, tmp: Path) -> dict[str, Any]:
    dirs = _setup(tmp)
    envs = {variant: _env(variant, endpoint, dirs) for variant in VARIANTS}
    sample = _probe("layer", envs["layer"], dirs["task"])["origins"]
    if not (sample and sample[0].startswith(str(dirs["opt"])) and sample[0].endswith("|source")):
        raise RuntimeError(f"the layer probe did not import the layer from its .pyc-free copy: {sample}")
    for variant in VARIANTS:  # one unmeasured start each: the page cache holds every file alike afterwards
        _probe(variant, envs[variant], dirs["task"])
    raw: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for round_ in range(samples):
        turn = round_ % len(VARIANTS)
        for variant in VARIANTS[turn:] + VARIANTS[:turn]:
            raw[variant].append(_probe(variant, envs[variant], dirs["task"]))
    systems = {}
    for variant, runs in raw.items():
        systems[variant] = {key: statistics.median(r[key] for r in runs) for key in ("wall_ms", "cpu_ms", "hwm_mb",
                                                                                   "rss_mb")}
        systems[variant]["wall_ms_all"] = [round(r["wall_ms"], 2) for r in runs]
        systems[variant]["cpu_ms_all"] = [round(r["cpu_ms"], 2) for r in runs]
        systems[variant]["origins"] = runs[0]["origins"]
    bare = systems["bare"]
    return {
        "samples": samples,
        "note": "layer without .pyc, PYTHONDONTWRITEBYTECODE=1; Powertools with its .pyc unless marked",
        "systems": systems,
        "overhead_ms": {v: systems[v]["wall_ms"] - bare["wall_ms"] for v in VARIANTS if v != "bare"},
        "overhead_cpu_ms": {v: systems[v]["cpu_ms"] - bare["cpu_ms"] for v in VARIANTS if v != "bare"},
        "added_rss_mb": {v: systems[v]["hwm_mb"] - bare["hwm_mb"] for v in VARIANTS if v != "bare"},
        "importtime": _importtime(envs["layer"], dirs["task"]),
        "rss_steps": _rss_steps(envs["layer"], dirs["task"]),
    }


if __name__ == "__main__":  # a quick look without the rest: python bench/initbench.py
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        print(json.dumps(measure(5, "http://127.0.0.1:9", Path(scratch)), indent=1))
    os._exit(0)
