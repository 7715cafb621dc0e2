"""Init: fresh processes, from start to "ready for the first event", wall time, CPU and peak RSS (VmHWM).

- bare: Python starts and imports the handler module (the baseline every function pays);
- layer: Python starts and imports the interceptor, which reads its settings, builds its DynamoDB client and
  imports the handler module;
- powertools: Python starts, imports the handler module and Powertools' idempotency utility, constructs
  DynamoDBPersistenceLayer and decorates the handler.

Each against the counting proxy over http, and (TLS_VARIANTS, with `tls_upstream`) bare, the layer and
Powertools against an https endpoint on loopback: bench/tls.py's forwarder in front of DynamoDB Local, trusted
through AWS_CA_BUNDLE. The probe reports which transport the layer built and whether its init went over TLS.

Bytecode: the layer ships unchecked-hash .pyc for each Python the build could compile for (Lambda's /opt is
read-only, so none can be written there), so its package is copied to a stand-in /opt/python with such .pyc for
this Python (and without any, `layer (no .pyc)`), and every probe runs with PYTHONDONTWRITEBYTECODE=1.
boto3, botocore, urllib3 and jmespath keep their .pyc, as the managed runtime's do. The handler module, like
/var/task, has none. Powertools' own layer is built per Python version with pip, which compiles, and the layer
canary in its repository fails when imports recompile sources (an older layer Dockerfile deleted .pyc, so what a
given release ships is not verified here); so Powertools keeps its .pyc in the comparison (its better case) and
is measured without them too, for reference.
"""

from __future__ import annotations

import compileall
import json
import os
import py_compile
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
if sys.argv[6] == "runtime":
    import awslambdaric.bootstrap  # what the managed runtime has imported before it loads any handler module
if sys.argv[5] == "boto3":
    import boto3  # what the function's own module does: a client at init
    client = boto3.client("dynamodb")
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
# Which transport the layer built (the lean client with its target's source, or boto3), and whether its init went
# over TLS (the connection pool keeps the context it made for its first connection); whether ssl was imported by
# ready, on any system; how the layer trusted its CA bundle, as aws.trust records it ("capath": a shipped
# directory, "cafile": the file).
cycle = getattr(getattr(sys.modules.get("idempotency_layer.interceptor"), "handler", None), "cycle", None)
transport = getattr(getattr(cycle, "store", None), "transport", None)
pool = getattr(transport, "pool", None)
tls = getattr(pool, "_context", None) is not None
way = getattr(sys.modules.get("idempotency_layer.aws.trust"), "last_way", None) or "-"
source = getattr(getattr(transport, "target", None), "source", None)
name = "-" if transport is None else type(transport).__name__ + (f"({source})" if source else "")
print(name, getattr(pool, "_https", "-"), tls, "ssl" in sys.modules, getattr(pool, "_cafile", None) or "-", way,
      flush=True)
"""

# Peak RSS after each step of the layer's imports, in order: which dependency the added megabytes come from.
RSS_STEPS = """
import sys
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
steps = [("python + handler module", "import bench_handler"),
         ("the runtime's bootstrap (awslambdaric.bootstrap)", "import awslambdaric.bootstrap"),
         ("orjson", "import orjson"),
         ("socket, select, hmac, http.client (the lean client's standard library)",
          "import socket, select, hmac, http.client"),
         ("jmespath", "import jmespath"),
         ("the rest of the interceptor's init (config, the DynamoDB client, handler)",
          "import idempotency_layer.interceptor"),
         ("an https endpoint's TLS context (import ssl, load the CA bundle of the https init rows)",
          "import os; from idempotency_layer.aws.trust import tls_context; "
          "tls_context(os.environ.get('BENCH_CA_BUNDLE'))")]
for name, code in steps:
    exec(code)
    print(hwm(), name, sep="\t")
"""

VARIANTS = ("bare", "layer", "layer (no .pyc)", "layer-botocore", "layer-boto3", "powertools", "powertools (no .pyc)",
            "bare, handler imports boto3", "layer, handler imports boto3", "powertools, handler imports boto3",
            "bare, no runtime modules", "layer, no runtime modules")
# Every probe but the `no runtime modules` pair starts as a Lambda function does: the runtime's bootstrap
# (awslambdaric.bootstrap, with json, logging, threading and decimal) is imported before the handler module,
# so what the layer shares with the runtime costs it nothing, as on Lambda; and the layer's probes run through
# its exec wrapper (bash), as AWS_LAMBDA_EXEC_WRAPPER runs it. The `no runtime modules` pair is the bench's
# earlier measure: plain Python, no wrapper.
WRAPPER = LAYER_SRC.parent / "wrapper" / "idempotency-wrapper"
# `layer-botocore`: the lean transport on its botocore path, as any environment other than the plain Lambda one
# gets it (here: a config file that holds a section, which only botocore reads).
# Over https (bench/tls.py: a TLS-terminating forwarder on loopback in front of DynamoDB Local), with AWS_CA_BUNDLE
# set for every system to the CA bundle the layer would load on its own (certifi's or botocore's cacert.pem, as
# aws.environment.ca_bundle finds it) with the run's throwaway CA appended; `test CA only` trusts a bundle of
# that CA alone, to show what loading the full bundle costs. Each is measured over `bare, https`. The layer's copies
# carry a certificate directory for the first bundle (_ship_cacerts); each probe says which way it trusted.
TLS_VARIANTS = ("bare, https", "layer, https", "layer, https, test CA only", "powertools, https")
HTTP_OF = {"bare, https": "bare", "layer, https": "layer", "layer, https, test CA only": "layer",
           "powertools, https": "powertools"}


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
    dirs["config"] = tmp / "aws-config"
    dirs["config"].write_text("[default]\n")
    # As the zip ships it for this Python: unchecked-hash .pyc (build.sh); and without, as for a Python the
    # build had no interpreter of (the layer's modules compiled at every start, /opt being read-only).
    _copy_package(LAYER_SRC / "idempotency_layer", dirs["opt-pyc"])
    compileall.compile_dir(dirs["opt-pyc"], quiet=1, force=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    _copy_package(LAYER_SRC / "idempotency_layer", dirs["opt"])
    _copy_package(Path(aws_lambda_powertools.__file__).parent, dirs["powertools"])
    return dirs


def _env(variant: str, endpoint: str, dirs: dict[str, Path], https: str | None = None) -> dict[str, str]:
    if variant in TLS_VARIANTS:
        assert https is not None
        endpoint = https
    env = base_env(endpoint)
    env.pop("REQUESTS_CA_BUNDLE", None)  # unset on Lambda; the layer and botocore would trust it (a host's store)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONPATH", None)
    env["BENCH_TABLE"] = "bench-init"
    if variant.startswith("layer"):
        env.update(layer_env("bench-init", endpoint, "boto3" if variant == "layer-boto3" else "lean"))
        env["PYTHONPATH"] = str(dirs["opt" if variant == "layer (no .pyc)" else "opt-pyc"])
        if variant == "layer-botocore":
            env["AWS_CONFIG_FILE"] = str(dirs["config"])
        if not variant.endswith("no runtime modules"):
            env["_HANDLER"] = env.pop("IDEMPOTENCY_ORIGINAL_HANDLER")  # the wrapper sets it from _HANDLER
    elif variant == "powertools (no .pyc)":
        env["PYTHONPATH"] = str(dirs["powertools"])
    if variant in TLS_VARIANTS:
        env["AWS_CA_BUNDLE"] = str(dirs["ca" if variant.endswith("test CA only") else "bundle"])
    return env


def _probe(variant: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    kind = "bare" if variant.startswith("bare") else "layer" if variant.startswith("layer") else "powertools"
    started = time.perf_counter()
    imports = "boto3" if variant.endswith("handler imports boto3") else "-"
    runtime = "-" if variant.endswith("no runtime modules") else "runtime"
    argv = [python(), "-c", PROBE, kind, KEY_JMESPATH, str(TTL_SECONDS), KEY_PREFIX, imports, runtime]
    if kind == "layer" and runtime == "runtime":
        argv = ["bash", str(WRAPPER), *argv]  # it swaps _HANDLER (set in _env) and execs the runtime command
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
    origins, transport = rest.splitlines()
    name, https, tls, ssl_imported, cafile, way = transport.split()
    return {"wall_ms": wall * 1000, "cpu_ms": float(cpu) * 1000, "hwm_mb": int(hwm) / 1024,
            "rss_mb": int(rss) / 1024, "origins": origins.split(),
            "transport": {"name": name, "https": https == "True", "tls": tls == "True",
                          "ssl_imported": ssl_imported == "True", "cafile": None if cafile == "-" else cafile,
                          "trust": None if way == "-" else way}}


def _direct(env: dict[str, str]) -> dict[str, str]:
    """`env` for running the interceptor without the wrapper: the handler where the wrapper would put it."""
    env = dict(env)
    if "_HANDLER" in env:
        env["IDEMPOTENCY_ORIGINAL_HANDLER"] = env.pop("_HANDLER")
    return env


def _importtime(env: dict[str, str], cwd: Path, runs: int = 3) -> list[dict[str, Any]]:
    """Top 10 cumulative import times of the interceptor after the runtime's bootstrap (whose own imports are
    left out: the layer finds them loaded), each module's median over `runs` runs."""
    seen: dict[str, list[tuple[int, int]]] = {}
    code = "import awslambdaric.bootstrap; import idempotency_layer.interceptor"
    for _ in range(runs):
        done = subprocess.run([python(), "-X", "importtime", "-c", code],
                              env=_direct(env), cwd=cwd, capture_output=True, text=True, check=True)
        lines = done.stderr.splitlines()
        # importtime prints a module after what it imported: everything up to the bootstrap's line is its own.
        ends = [i for i, line in enumerate(lines) if line.rstrip().endswith("| awslambdaric.bootstrap")]
        for line in lines[ends[0] + 1 if ends else 0:]:
            if not line.startswith("import time:") or "cumulative" in line:
                continue
            own, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
            seen.setdefault(name.strip(), []).append((int(own), int(cumulative)))
    rows = [{"module": name, "self_ms": statistics.median(o for o, _ in v) / 1000,
             "cumulative_ms": statistics.median(c for _, c in v) / 1000} for name, v in seen.items()]
    return sorted(rows, key=lambda r: -r["cumulative_ms"])[:10]


def _rss_steps(env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    done = subprocess.run([python(), "-c", RSS_STEPS], env=_direct(env), cwd=cwd, capture_output=True, text=True,
                          check=True)
    rows, previous = [], None
    for line in done.stdout.splitlines():
        kb, name = line.split("\t", 1)
        mb = int(kb) / 1024
        rows.append({"step": name, "hwm_mb": mb, "added_mb": None if previous is None else mb - previous})
        previous = mb
    return rows


def _tls_setup(tmp: Path, dirs: dict[str, Path], layer_env_: dict[str, str]) -> dict[str, Any]:
    """The throwaway CA and the two bundles the https rows trust (dirs["ca"], dirs["bundle"])."""
    import tls

    made = tls.certificates(tmp / "tls")
    # The bundle the layer would load with no AWS_CA_BUNDLE, resolved as in its probe process.
    done = subprocess.run([python(), "-c", "import os; from idempotency_layer.aws.environment import ca_bundle; "
                           "print(ca_bundle(os.environ))"], env=layer_env_, cwd=dirs["task"], capture_output=True,
                          text=True, check=True)
    default = done.stdout.strip()
    if default in ("", "None"):
        raise RuntimeError("the layer resolves no CA bundle of its own here (no certifi, no botocore cacert.pem)")
    dirs["ca"] = made.ca
    dirs["bundle"] = tmp / "tls" / "bundle.pem"
    text = Path(default).read_text()
    dirs["bundle"].write_text(text.rstrip("\n") + "\n" + made.ca.read_text())
    _ship_cacerts(dirs, [Path(default), dirs["bundle"]])
    return {"certificates_by": made.made_by, "default_bundle": default,
            "default_bundle_certs": text.count("BEGIN CERTIFICATE"), "cert": made.cert, "key": made.key}


def _ship_cacerts(dirs: dict[str, Path], bundles: list[Path]) -> None:
    """What the build ships (scripts/cacert_dirs.py) in both stand-in layer copies: a hashed certificate directory
    per bundle, here also for the https rows' bundle (the default one plus the run's CA, which no build ships),
    so that the layer, https row trusts it as the layer trusts its default bundle on Lambda (capath). The
    `test CA only` bundle gets none: it is loaded as a file."""
    from scripts import cacert_dirs  # the repository root is on sys.path (run.py)

    for root in (dirs["opt-pyc"], dirs["opt"]):
        for bundle in bundles:
            cacert_dirs.make_dir(bundle, root / "idempotency_layer" / "aws" / "cacerts")


def measure(samples: int, endpoint: str, tmp: Path, tls_upstream: tuple[str, int] | None = None) -> dict[str, Any]:
    """`tls_upstream` (DynamoDB Local's host and port): also measure the https rows, through a TLS forwarder."""
    dirs = _setup(tmp)
    forwarder = None
    variants = VARIANTS
    tls_info: dict[str, Any] = {}
    try:
        if tls_upstream is not None:
            import tls

            tls_info = _tls_setup(tmp, dirs, _env("layer", endpoint, dirs))
            forwarder = tls.TLSForwarder(tls_upstream, tls_info.pop("cert"), tls_info.pop("key"))
            tls_info["endpoint"] = forwarder.endpoint
            variants = VARIANTS + TLS_VARIANTS
        https = forwarder.endpoint if forwarder else None
        envs = {variant: _env(variant, endpoint, dirs, https) for variant in variants}
        if forwarder:
            envs["layer"]["BENCH_CA_BUNDLE"] = str(dirs["bundle"])  # for the RSS steps' TLS context only
        result = _measure(samples, variants, envs, dirs)
        if forwarder:
            result["tls"] = _tls_summary(result, tls_info, forwarder.connections)
        return result
    finally:
        if forwarder is not None:
            forwarder.close()


def _measure(samples: int, variants: tuple[str, ...], envs: dict[str, dict[str, str]],
             dirs: dict[str, Path]) -> dict[str, Any]:
    sample = _probe("layer", envs["layer"], dirs["task"])["origins"]
    if not (sample and sample[0].startswith(str(dirs["opt-pyc"])) and sample[0].endswith("|pyc")):
        raise RuntimeError(f"the layer probe did not import the layer with its shipped bytecode: {sample}")
    for variant in variants:  # one unmeasured start each: the page cache holds every file alike afterwards
        _probe(variant, envs[variant], dirs["task"])
    raw: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for round_ in range(samples):
        turn = round_ % len(variants)
        for variant in variants[turn:] + variants[:turn]:
            raw[variant].append(_probe(variant, envs[variant], dirs["task"]))
    systems = {}
    for variant, runs in raw.items():
        systems[variant] = {key: statistics.median(r[key] for r in runs) for key in ("wall_ms", "cpu_ms", "hwm_mb",
                                                                                   "rss_mb")}
        systems[variant]["wall_ms_all"] = [round(r["wall_ms"], 2) for r in runs]
        systems[variant]["cpu_ms_all"] = [round(r["cpu_ms"], 2) for r in runs]
        systems[variant]["origins"] = runs[0]["origins"]
        transports = {json.dumps(r["transport"], sort_keys=True) for r in runs}
        if len(transports) != 1:
            raise RuntimeError(f"init probe {variant}: the transport differed between samples: {transports}")
        systems[variant]["transport"] = runs[0]["transport"]
    for variant in variants:
        found = systems[variant]["transport"]
        if variant.startswith("layer") and variant in TLS_VARIANTS and not (found["https"] and found["tls"]) \
                and found["name"] == "Client(environment)":
            raise RuntimeError(f"init probe {variant}: the lean client's init made no TLS connection: {found}")

    def base(variant: str) -> dict[str, Any]:  # an https row is measured over the bare https row
        if variant.endswith("no runtime modules"):
            return systems["bare, no runtime modules"]
        return systems["bare, https" if variant in TLS_VARIANTS else "bare"]

    measured = [v for v in variants if v not in ("bare", "bare, https", "bare, no runtime modules")]
    return {
        "samples": samples,
        "note": "layer with its shipped .pyc, PYTHONDONTWRITEBYTECODE=1; Powertools with its .pyc unless marked",
        "systems": systems,
        "overhead_ms": {v: systems[v]["wall_ms"] - base(v)["wall_ms"] for v in measured},
        "overhead_cpu_ms": {v: systems[v]["cpu_ms"] - base(v)["cpu_ms"] for v in measured},
        "added_rss_mb": {v: systems[v]["hwm_mb"] - base(v)["hwm_mb"] for v in measured},
        # Over a bare handler that imports boto3 itself: what attaching the layer adds to such a function.
        "with_boto3": {
            name: {
                "over_ms": systems[f"{name}, handler imports boto3"]["wall_ms"]
                - systems["bare, handler imports boto3"]["wall_ms"],
                "over_cpu_ms": systems[f"{name}, handler imports boto3"]["cpu_ms"]
                - systems["bare, handler imports boto3"]["cpu_ms"],
                "added_rss_mb": systems[f"{name}, handler imports boto3"]["hwm_mb"]
                - systems["bare, handler imports boto3"]["hwm_mb"],
            }
            for name in ("layer", "powertools")
        },
        "importtime": _importtime(envs["layer"], dirs["task"]),
        "rss_steps": _rss_steps(envs["layer"], dirs["task"]),
    }


def _tls_summary(result: dict[str, Any], info: dict[str, Any], connections: int) -> dict[str, Any]:
    """Per https row: its figures over bare, its http row's, and what https added over http."""
    rows = {}
    for variant, http in HTTP_OF.items():
        if variant == "bare, https":
            continue
        rows[variant] = {
            "http": http,
            "over_ms": result["overhead_ms"][variant], "over_cpu_ms": result["overhead_cpu_ms"][variant],
            "added_rss_mb": result["added_rss_mb"][variant],
            "http_over_ms": result["overhead_ms"][http], "http_over_cpu_ms": result["overhead_cpu_ms"][http],
            "http_added_rss_mb": result["added_rss_mb"][http],
            "tls_adds_ms": result["overhead_ms"][variant] - result["overhead_ms"][http],
            "tls_adds_cpu_ms": result["overhead_cpu_ms"][variant] - result["overhead_cpu_ms"][http],
            "tls_adds_rss_mb": result["added_rss_mb"][variant] - result["added_rss_mb"][http],
            "transport": result["systems"][variant]["transport"],
        }
    return {**info, "forwarded_connections": connections, "rows": rows}


if __name__ == "__main__":  # a quick look without the rest: python bench/initbench.py
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        print(json.dumps(measure(5, "http://127.0.0.1:9", Path(scratch)), indent=1))
    os._exit(0)
