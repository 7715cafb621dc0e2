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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE = Path(os.environ.get("IDEMPOTENCY_TEST_CACHE", Path.home() / ".cache" / "idempotency-layer-tests"))
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


def _interpreters() -> dict[str, str]:
    found: dict[str, str] = {}
    root = shutil.which("pyenv") and subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
    for version in PYTHONS:
        candidates = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python3")) if root else []
        candidates = [c for c in candidates if os.path.basename(os.path.dirname(os.path.dirname(c)))
                      .replace(version + ".", "").isdigit()]
        if candidates:
            found[version] = candidates[-1]
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not found and here in PYTHONS:
        found[here] = sys.executable
    return found


def runtimes() -> dict[str, Path]:
    """Python version -> the python of a venv with awslambdaric and boto3."""
    result: dict[str, Path] = {}
    for version, interpreter in _interpreters().items():
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
    if shutil.which("java") is None:
        print("java is missing: apt-get install -y openjdk-17-jre-headless (./build.sh test does this)")
        return 1
    print(f"DynamoDB Local: {dynamodb_local()}")
    print(f"Runtime Interface Emulator: {rie()}")
    for version, python in runtimes().items():
        print(f"runtime python{version}: {python}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
