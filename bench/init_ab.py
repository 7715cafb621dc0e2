"""An A/B of the layer's init: this tree's layer against a revision's, interleaved in fresh processes.

    .venv/bin/python bench/init_ab.py REV [--samples N]

The same probe as the benchmark's init rows (bench/initbench.py: the wrapper, the runtime's modules, the
interceptor's import, its DynamoDB client built and the table's key schema checked against DynamoDB Local through
the counting proxy), each layer copied with its shipped bytecode, the two and the bare handler started in turn
(the order rotated each round). It prints the medians of wall and CPU time to "ready", each layer's over the bare
start, and B's over A's; and the modules each imported (listed after the table), which must be the same set under
their new names. It reports; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import compileall
import py_compile
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests.support, after bench/ itself

import initbench
from common import BENCH, LAYER_SRC

ROOT = BENCH.parent


def _layer_at(revision: str, into: Path) -> Path:
    """The layer package of `revision`, with bytecode compiled as the zip ships it."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "layer/idempotency_layer"],
                             capture_output=True, check=True).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    root = into / "opt"
    shutil.move(str(into / "layer"), str(root))
    _compile(root)
    return root


def _compile(root: Path) -> None:
    compileall.compile_dir(root, quiet=1, force=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)


LISTED = ("import sys\nfrom idempotency_layer import interceptor\n"
          "wanted = ('idempotency_layer', 'botocore', 'valkey')\n"
          "print(' '.join(sorted(m for m in sys.modules if m.startswith(wanted))))")


def _imported(env: dict[str, str], cwd: Path) -> list[str]:
    """The layer's modules (and any botocore or valkey one) an init under `env` imported, as the runtime starts it."""
    done = subprocess.run(["bash", str(initbench.WRAPPER), initbench.python(), "-c", LISTED], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


def run(revision: str, samples: int, endpoint: str, tmp: Path) -> dict[str, dict[str, float]]:
    dirs = initbench._setup(tmp)
    roots = {"A": _layer_at(revision, tmp / "a"), "B": tmp / "b" / "opt"}
    roots["B"].mkdir(parents=True)
    shutil.copytree(LAYER_SRC / "idempotency_layer", roots["B"] / "idempotency_layer",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _compile(roots["B"])
    envs = {"bare": initbench._env("bare", endpoint, dirs)}
    for name, root in roots.items():
        envs[name] = {**initbench._env("layer", endpoint, dirs), "PYTHONPATH": str(root)}
    for name in envs:  # one unmeasured start each: the page cache then holds every file alike
        initbench._probe("layer" if name != "bare" else "bare", envs[name], dirs["task"])
    runs: dict[str, list[dict]] = {name: [] for name in envs}
    order = list(envs)
    for round_ in range(samples):
        turn = round_ % len(order)
        for name in order[turn:] + order[:turn]:
            runs[name].append(initbench._probe("layer" if name != "bare" else "bare", envs[name], dirs["task"]))
    found = {name: {key: statistics.median(r[key] for r in rs) for key in ("wall_ms", "cpu_ms", "hwm_mb")}
             for name, rs in runs.items()}
    for name in ("A", "B"):
        found[name]["imported"] = _imported(envs[name], dirs["task"])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("revision", help="the layer before (A); B is this tree's")
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args(argv)
    from tests.support.counting_proxy import CountingProxy
    from tests.support.dynamodb_local import DynamoDBLocal

    with tempfile.TemporaryDirectory(prefix="idempotency-init-ab-") as tmp:
        ddb = DynamoDBLocal(Path(tmp) / "dynamodb.log").start()
        proxy = CountingProxy("127.0.0.1", ddb.port)
        try:
            from run import _tables

            _tables(ddb.endpoint)
            found = run(args.revision, args.samples, proxy.endpoint, Path(tmp))
        finally:
            proxy.close()
            ddb.stop()
    bare = found["bare"]
    print(f"init A/B, {args.samples} fresh processes each, interleaved: A = {args.revision}, B = this tree")
    print("| | wall ms | CPU ms | over bare, wall | over bare, CPU | peak RSS MB | modules imported |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in ("bare", "A", "B"):
        row = found[name]
        over = ("-", "-") if name == "bare" else (f"{row['wall_ms'] - bare['wall_ms']:.1f}",
                                                  f"{row['cpu_ms'] - bare['cpu_ms']:.1f}")
        print(f"| {name} | {row['wall_ms']:.1f} | {row['cpu_ms']:.1f} | {over[0]} | {over[1]} | {row['hwm_mb']:.1f} "
              f"| {len(row['imported']) if 'imported' in row else '-'} |")
    a, b = found["A"], found["B"]
    for name in ("A", "B"):
        foreign = [m for m in found[name]["imported"] if not m.startswith("idempotency_layer")
                   or ".valkey" in m or m.endswith((".s3", ".botocore_source", ".boto3_client"))]
        print(f"{name} imported: {' '.join(found[name]['imported'])}")
        print(f"{name}: Valkey, S3, botocore modules imported at init: {foreign or 'none'}")
    print(f"B over A: wall {b['wall_ms'] / a['wall_ms']:.3f}x, CPU {b['cpu_ms'] / a['cpu_ms']:.3f}x; the layer's own "
          f"init (over bare) {(b['cpu_ms'] - bare['cpu_ms']) / (a['cpu_ms'] - bare['cpu_ms']):.3f}x in CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
