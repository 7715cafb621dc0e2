"""Fetch what the tests run on, once, into a cache outside the repository.

- DynamoDB Local: AWS's jar, as carried by the npm package `amplify-dynamodb-simulator` (`emulator/`).
- The Lambda Runtime Interface Emulator: the binary inside the `aws-sam-cli` wheel.
- Runtimes: a venv per Python 3.10-3.13 found (pyenv), with `awslambdaric` and `boto3`, standing in for the
  managed runtime's client and its bundled SDK.

`python -m tests.support.downloads` fetches everything and says what it has.
"""

from __future__ import annotations

import fcntl
import glob
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE = Path(os.environ.get("IDEMLAYER_TEST_CACHE", Path.home() / ".cache" / "idempotency-layer-tests"))
PYTHONS = ("3.10", "3.11", "3.12", "3.13")


@contextmanager
def _locked(name: str) -> Iterator[None]:
    # Two test processes (or a test run and the demo) may fetch at once.
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(*args: str, cwd: str | None = None) -> None:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def dynamodb_local() -> Path:
    """The folder holding DynamoDBLocal.jar and DynamoDBLocal_lib/."""
    target = CACHE / "dynamodb-local"
    if (target / "DynamoDBLocal.jar").exists():
        return target
    with _locked("dynamodb-local"):
        if (target / "DynamoDBLocal.jar").exists():
            return target
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            _run("npm", "pack", "--silent", "amplify-dynamodb-simulator", cwd=tmp)
            (tarball,) = glob.glob(os.path.join(tmp, "*.tgz"))
            with tarfile.open(tarball) as archive:
                members = [m for m in archive.getmembers() if m.name.startswith("package/emulator/")]
                safe = {"filter": "data"} if sys.version_info >= (3, 12) else {}
                archive.extractall(tmp, members=members, **safe)
            os.replace(os.path.join(tmp, "package", "emulator"), target)
    return target


def rie() -> Path:
    """The aws-lambda-rie binary for this machine's architecture."""
    arch = "arm64" if platform.machine() in ("aarch64", "arm64") else "x86_64"
    target = CACHE / "rie" / f"aws-lambda-rie-{arch}"
    if target.exists():
        return target
    with _locked("rie"):
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            _run(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", tmp, "aws-sam-cli")
            (wheel,) = glob.glob(os.path.join(tmp, "aws_sam_cli-*.whl"))
            with zipfile.ZipFile(wheel) as archive, open(tmp + "/rie", "wb") as out:
                out.write(archive.read(f"samcli/local/rapid/aws-lambda-rie-{arch}"))
            os.chmod(tmp + "/rie", 0o755)
            os.replace(tmp + "/rie", target)
    return target


def _version_key(path: str) -> tuple[int, ...]:
    # .../versions/3.10.13/bin/python3 -> (3, 10, 13): numeric, so 3.10.13 sorts after 3.10.9.
    return tuple(int(part) for part in Path(path).parents[1].name.split("."))


def interpreters() -> dict[str, str]:
    """Python version -> an interpreter for it (newest pyenv patch release), without installing anything.

    Without pyenv (or with none of 3.10-3.13 in it) only the running interpreter's version is used.
    """
    found: dict[str, str] = {}
    root = ""
    if shutil.which("pyenv"):
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
    for version in PYTHONS:
        candidates = glob.glob(f"{root}/versions/{version}.*/bin/python3") if root else []
        # Only plain releases (3.13.0, not 3.13.0t or 3.13-dev): those are what Lambda runs.
        candidates = [c for c in candidates if Path(c).parents[1].name.replace(".", "").isdigit()]
        if candidates:
            found[version] = max(candidates, key=_version_key)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not found and here in PYTHONS:
        found[here] = sys.executable
    return found


def runtimes() -> dict[str, Path]:
    """Python version -> the python of a venv with awslambdaric and boto3."""
    result: dict[str, Path] = {}
    for version, interpreter in interpreters().items():
        venv = CACHE / "runtimes" / f"py{version}"
        python = venv / "bin" / "python"
        if not (venv / ".ready").exists():
            with _locked(f"runtime-{version}"):
                if not (venv / ".ready").exists():
                    shutil.rmtree(venv, ignore_errors=True)
                    _run(interpreter, "-m", "venv", str(venv))
                    _run(str(python), "-m", "pip", "install", "--quiet", "awslambdaric", "boto3")
                    (venv / ".ready").touch()
        result[version] = python
    return result


def main() -> int:
    """Fetch everything; report each failure by name so a broken download is not mistaken for a test failure."""
    failed = 0
    steps: list[tuple[str, Callable[[], object]]] = [
        ("DynamoDB Local", dynamodb_local), ("Runtime Interface Emulator", rie), ("runtimes", runtimes)]
    for what, fetch in steps:
        try:
            got = fetch()
        except Exception as error:
            print(f"{what}: FAILED: {error}", file=sys.stderr)
            failed += 1
            continue
        if isinstance(got, dict):
            for version, python in got.items():
                print(f"runtime python{version}: {python}")
            if not got:
                print(f"{what}: FAILED: no Python {', '.join(PYTHONS)} found (pyenv or the running one)",
                      file=sys.stderr)
                failed += 1
        else:
            print(f"{what}: {got}")
    if shutil.which("java") is None:
        print("java is missing, and DynamoDB Local needs Java 17: apt-get install -y openjdk-17-jre-headless "
              "(./build.sh test installs it)", file=sys.stderr)
        failed += 1
    else:
        print(f"java: {shutil.which('java')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
