"""The layer zips built by ./build.sh: layout, modes, per-Python orjson per architecture, size."""

from __future__ import annotations

import platform
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts import verify_layer

ROOT = Path(__file__).resolve().parents[2]
ARCHES = {"x86_64": "x86_64", "arm64": "aarch64"}  # Lambda's name -> the machine in the .so name
PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.14"]
MAX_BYTES = 3 * 1024 * 1024
PACKAGE_SRC = ROOT / "layer" / "idempotency_layer"


def zip_path(arch: str) -> Path:
    return ROOT / "dist" / f"idempotency-layer-{arch}.zip"


def source_files() -> list[str]:
    return sorted(
        p.relative_to(PACKAGE_SRC).as_posix() for p in PACKAGE_SRC.rglob("*.py") if "__pycache__" not in p.parts
    )


def dist_is_fresh() -> bool:
    """True when both zips are newer than every build input and are default (no boto3) builds."""
    inputs = [ROOT / "build.sh", ROOT / "wrapper" / "idempotency-wrapper", *PACKAGE_SRC.rglob("*.py")]
    newest = max(p.stat().st_mtime for p in inputs)
    for arch in ARCHES:
        z = zip_path(arch)
        if not z.exists() or z.stat().st_mtime < newest:
            return False
        with zipfile.ZipFile(z) as zf:
            if any(n.startswith("python/boto3/") for n in zf.namelist()):
                return False
    return True


@pytest.fixture(scope="module")
def zips() -> dict[str, Path]:
    # ./build.sh test builds right before pytest; rebuild only when that dist/ is stale or missing.
    if not dist_is_fresh():
        subprocess.run(["bash", str(ROOT / "build.sh"), "build"], cwd=ROOT, check=True)
    return {arch: zip_path(arch) for arch in ARCHES}


def mode(info: zipfile.ZipInfo) -> int:
    return info.external_attr >> 16


@pytest.mark.parametrize("arch", ARCHES)
def test_wrapper_at_root_executable(zips: dict[str, Path], arch: str) -> None:
    with zipfile.ZipFile(zips[arch]) as zf:
        info = zf.getinfo("idempotency-wrapper")
        assert mode(info) == 0o100755, oct(mode(info))
        assert zf.read(info) == (ROOT / "wrapper" / "idempotency-wrapper").read_bytes()


@pytest.mark.parametrize("arch", ARCHES)
def test_package_is_exactly_the_sources(zips: dict[str, Path], arch: str) -> None:
    prefix = "python/idempotency_layer/"
    with zipfile.ZipFile(zips[arch]) as zf:
        packaged = sorted(n[len(prefix) :] for n in zf.namelist() if n.startswith(prefix))
        assert packaged == [f for f in source_files() if not f.startswith(("tests/", "test/"))]
        assert all(mode(zf.getinfo(prefix + f)) == 0o100644 for f in packaged)


@pytest.mark.parametrize("arch", ARCHES)
def test_orjson_for_each_python_and_only_this_arch(zips: dict[str, Path], arch: str) -> None:
    with zipfile.ZipFile(zips[arch]) as zf:
        sos = [n for n in zf.namelist() if n.endswith(".so")]
    for py in PYTHONS:
        tag = py.replace(".", "")
        want = f"python/lib/python{py}/site-packages/orjson/orjson.cpython-{tag}-{ARCHES[arch]}-linux-gnu.so"
        assert want in sos, f"{want} missing"
    assert len(sos) == len(PYTHONS), sos


@pytest.mark.parametrize("arch", ARCHES)
def test_no_bytecode_tests_or_boto3(zips: dict[str, Path], arch: str) -> None:
    with zipfile.ZipFile(zips[arch]) as zf:
        names = zf.namelist()
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n.split("/")]
    assert not [n for n in names if {"tests", "test"} & set(n.split("/")[:-1])]
    assert not [n for n in names if n.startswith(("python/boto3/", "python/botocore/"))]


@pytest.mark.parametrize("arch", ARCHES)
def test_size_and_determinism(zips: dict[str, Path], arch: str) -> None:
    assert zips[arch].stat().st_size < MAX_BYTES
    with zipfile.ZipFile(zips[arch]) as zf:
        infos = zf.infolist()
    assert [i.filename for i in infos] == sorted(i.filename for i in infos)
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}


@pytest.mark.parametrize("arch", ARCHES)
def test_verifier_accepts_the_build(zips: dict[str, Path], arch: str) -> None:
    assert verify_layer.check(zips[arch], arch, PYTHONS, package_src=PACKAGE_SRC, max_bytes=MAX_BYTES) == []


def test_bundled_orjson_imports_on_this_machine(zips: dict[str, Path], tmp_path: Path) -> None:
    arch = {v: k for k, v in ARCHES.items()}.get(platform.machine())
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    if arch is None or py not in PYTHONS:
        pytest.skip(f"no layer build for {platform.machine()} / Python {py}")
    with zipfile.ZipFile(zips[arch]) as zf:
        zf.extractall(tmp_path)
    site = tmp_path / "python" / "lib" / f"python{py}" / "site-packages"
    # -S: no site-packages of our own, so only the layer's copies can be imported, as in /opt on Lambda.
    code = "import orjson, idempotency_layer; print(orjson.__file__); print(orjson.dumps({'a': 1}).decode())"
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        env={"PYTHONPATH": f"{site}:{tmp_path / 'python'}"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0].startswith(str(site)) and out[1] == '{"a":1}'


def test_verifier_reports_a_bad_zip(zips: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(zips["x86_64"]) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            if re.search(r"python3\.12/.*\.so$", info.filename):
                continue  # drop one Python's orjson
            data = src.read(info)
            if info.filename == "idempotency-wrapper":
                info.external_attr = 0o100644 << 16
            dst.writestr(info, data)
        dst.writestr("python/idempotency_layer/__pycache__/x.cpython-311.pyc", b"")
        dst.writestr("python/lib/python3.11/site-packages/x/y.cpython-311-aarch64-linux-gnu.so", b"")
    problems = "\n".join(verify_layer.check(bad, "x86_64", PYTHONS, max_bytes=MAX_BYTES))
    assert "idempotency-wrapper mode" in problems
    assert "cpython-312-x86_64-linux-gnu.so missing" in problems
    assert "compiled file" in problems
    assert "wrong-architecture binary" in problems
    cli = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "verify_layer.py"), "--arch", "x86_64", str(bad)],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 1 and "FAIL:" in cli.stderr
