"""Build the wheel for container images (`./build.sh wheel`) and check what is in it.

Usage: build_wheel.py --backend DIR --ca-bundles DIR [--out DIR]
       build_wheel.py --check WHEEL

The wheel holds what the layer zip's `python/idempotency_layer` holds at run time, minus the bytecode (pip
compiles at install): the package's sources, `py.typed`, and the certificate directories of the pinned CA bundles
(scripts/cacert_dirs.py, from `--ca-bundles`, the folder `./build.sh` installs botocore and certifi into). The
bash wrapper goes in unchanged as a data script (`idempotency-wrapper` on PATH after `pip install`); the
`idempotency-layer` console script is an entry point. orjson, jmespath and certifi are dependencies pip installs.

Built from a staged copy (build/wheel-src) so the generated certificates never enter the source tree, by
setuptools' PEP 517 backend imported from `--backend` (a pinned setuptools `./build.sh` installs from its wheel
cache: no network when the cache has it), with SOURCE_DATE_EPOCH fixed: the same sources give the same bytes.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "idempotency_layer"
WRAPPER = "idempotency-wrapper"
CONSOLE_SCRIPTS = {"idempotency-layer": "idempotency_layer.cli:main"}
REQUIRES = ("orjson", "jmespath", "certifi")
# 1980-01-01, the earliest time a zip entry can carry (the layer zip's entries carry it too).
SOURCE_DATE_EPOCH = "315532800"


def stage(dest: Path, ca_bundles: Path) -> Path:
    """Copy what the wheel is built from into `dest`: pyproject, licence, wrapper, sources, certificates."""
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "wrapper").mkdir(parents=True)
    for name in ("pyproject.toml", "LICENSE"):
        shutil.copyfile(ROOT / name, dest / name)
    shutil.copyfile(ROOT / "wrapper" / WRAPPER, dest / "wrapper" / WRAPPER)
    (dest / "wrapper" / WRAPPER).chmod(0o755)
    source = ROOT / "layer" / PACKAGE
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if not path.is_file() or {"__pycache__", "tests", "test"} & set(rel.parts):
            continue
        if path.suffix == ".py" or path.name == "py.typed":
            target = dest / "layer" / PACKAGE / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            target.chmod(0o644)
    cacerts = dest / "layer" / PACKAGE / "aws" / "cacerts"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cacert_dirs.py"), "--no-host", "--scan", str(ca_bundles),
         str(cacerts)],
        capture_output=True, text=True,
    )
    if run.returncode != 0:
        raise SystemExit(f"build_wheel: certificate directories failed: {run.stderr.strip()}")
    return dest


def build(src: Path, backend: Path, out: Path) -> Path:
    """Run setuptools' build_wheel on `src`; return the wheel, moved into `out` (replacing one of its name)."""
    code = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(backend.resolve()), "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH,
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    with tempfile.TemporaryDirectory(dir=src.parent) as scratch:
        # -I would drop PYTHONPATH; -S keeps the venv's older setuptools (and its .pth hooks) out of the way.
        run = subprocess.run([sys.executable, "-S", "-c", code, scratch], cwd=src, env=env,
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"build_wheel: setuptools failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        name = run.stdout.strip().splitlines()[-1]
        out.mkdir(parents=True, exist_ok=True)
        target = out / name
        os.replace(Path(scratch) / name, target)
    return target


def check(wheel: Path, package_src: Path = ROOT / "layer" / PACKAGE,
          wrapper: Path = ROOT / "wrapper" / WRAPPER) -> list[str]:
    """The problems found in `wheel` (empty when it is fine)."""
    problems: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        names = sorted(infos)
        dist_info = next((n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")), None)
        if dist_info is None:
            return [f"{wheel.name}: no .dist-info folder"]
        version = dist_info[: -len(".dist-info")]
        for src in sorted(package_src.rglob("*.py")):
            rel = src.relative_to(package_src).as_posix()
            if "__pycache__" not in rel.split("/") and f"{PACKAGE}/{rel}" not in infos:
                problems.append(f"{PACKAGE}/{rel} missing (present in {package_src})")
        for name in names:
            parts = name.split("/")
            if name.endswith((".pyc", ".pyo")) or "__pycache__" in parts or {"tests", "test"} & set(parts[:-1]):
                problems.append(f"{name}: no bytecode or tests in the wheel")
            elif not name.startswith((f"{PACKAGE}/", f"{version}.dist-info/", f"{version}.data/")):
                problems.append(f"{name}: outside the package, its .dist-info and its data scripts")
        folders = {n.split("/")[3] for n in names if n.startswith(f"{PACKAGE}/aws/cacerts/")}
        if len(folders) != 2 or not all(len(f) == 64 for f in folders):
            problems.append(f"want 2 certificate directories (botocore's and certifi's bundles), found {len(folders)}")

        script = infos.get(f"{version}.data/scripts/{WRAPPER}")
        if script is None:
            problems.append(f"{version}.data/scripts/{WRAPPER} missing")
        else:
            if zf.read(script) != wrapper.read_bytes():
                problems.append(f"{WRAPPER} differs from {wrapper}")
            if stat.S_IMODE(script.external_attr >> 16) != 0o755:
                problems.append(f"{WRAPPER} mode is {oct(script.external_attr >> 16)}, want 0o755")

        entry_points = f"{version}.dist-info/entry_points.txt"
        text = zf.read(entry_points).decode() if entry_points in infos else ""
        for script_name, target in CONSOLE_SCRIPTS.items():
            if f"{script_name} = {target}" not in text:
                problems.append(f"console script {script_name} = {target} missing from {entry_points}")

        metadata = email.parser.Parser().parsestr(zf.read(f"{version}.dist-info/METADATA").decode())
        required = {r.split(">")[0].split("=")[0].split(";")[0].strip().lower() for r in
                    metadata.get_all("Requires-Dist") or []}
        problems += [f"Requires-Dist {r} missing" for r in REQUIRES if r not in required]
        wheel_file = email.parser.Parser().parsestr(zf.read(f"{version}.dist-info/WHEEL").decode())
        if wheel_file.get_all("Tag") != ["py3-none-any"]:
            problems.append(f"tags {wheel_file.get_all('Tag')}, want py3-none-any (pure Python)")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", type=Path, help="a folder holding the pinned setuptools")
    ap.add_argument("--ca-bundles", type=Path, help="a folder holding botocore/ and certifi/ with cacert.pem")
    ap.add_argument("--out", type=Path, default=ROOT / "dist")
    ap.add_argument("--check", type=Path, metavar="WHEEL", help="only check an existing wheel")
    args = ap.parse_args(argv)
    if args.check:
        wheel = args.check
    else:
        if args.backend is None or args.ca_bundles is None:
            ap.error("--backend and --ca-bundles are needed to build")
        wheel = build(stage(ROOT / "build" / "wheel-src", args.ca_bundles), args.backend, args.out)
    problems = check(wheel)
    with zipfile.ZipFile(wheel) as zf:
        count, unzipped = len(zf.infolist()), sum(i.file_size for i in zf.infolist())
    print(f"{wheel.relative_to(ROOT) if wheel.is_relative_to(ROOT) else wheel}: {count} files, "
          f"{wheel.stat().st_size / 1024:.0f} KiB, {unzipped / 1024:.0f} KiB unzipped"
          + (": OK" if not problems else f": {len(problems)} problem(s)"))
    for problem in problems:
        print(f"  FAIL: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
