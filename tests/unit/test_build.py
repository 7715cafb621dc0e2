"""The layer zips built by ./build.sh: layout, modes, per-Python orjson and bytecode per architecture, size."""

from __future__ import annotations

import platform
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts import verify_layer

pytestmark = pytest.mark.built

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
        # Bytecode and the certificate directories have tests of their own.
        sources = [f for f in packaged if "__pycache__" not in f.split("/") and not f.startswith("aws/cacerts/")]
        assert sources == [f for f in source_files() if not f.startswith(("tests/", "test/"))]
        assert all(mode(zf.getinfo(prefix + f)) == 0o100644 for f in packaged)


@pytest.mark.parametrize("arch", ARCHES)
def test_the_pinned_ca_bundles_ship_as_certificate_directories(zips: dict[str, Path], arch: str) -> None:
    # botocore's (Lambda's runtime default) and certifi's, each a directory named by its bundle's SHA-256.
    prefix = "python/idempotency_layer/aws/cacerts/"
    with zipfile.ZipFile(zips[arch]) as zf:
        folders = {n[len(prefix):].split("/")[0] for n in zf.namelist() if n.startswith(prefix)} - {""}
        count = sum(1 for n in zf.namelist() if n.startswith(prefix) and not n.endswith("/"))
    assert len(folders) == 2 and all(len(f) == 64 for f in folders), folders
    assert count > 200  # over a hundred roots in each


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
def test_bytecode_only_of_the_package_and_no_tests_or_boto3(zips: dict[str, Path], arch: str) -> None:
    with zipfile.ZipFile(zips[arch]) as zf:
        names = zf.namelist()
        compiled = {n: zf.read(n) for n in names if n.endswith(".pyc") or "__pycache__" in n.split("/")}
    # Unchecked-hash .pyc of the package's modules only, for every module, for each Python the build had; this
    # machine's Python (the venv's) is always one of them.
    modules = {n[len("python/"):-3] for n in names if n.startswith("python/idempotency_layer/") and n.endswith(".py")}
    tags = {n.rsplit(".", 2)[1] for n in compiled}
    assert f"cpython-{sys.version_info.major}{sys.version_info.minor}" in tags
    for name, data in compiled.items():
        assert name.startswith("python/idempotency_layer/") and int.from_bytes(data[4:8], "little") == 1, name
    for tag in tags:
        for module in modules:
            folder, _, stem = module.rpartition("/")
            assert f"python/{folder}/__pycache__/{stem}.{tag}.pyc" in compiled
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


def test_the_shipped_bytecode_is_used_from_a_read_only_folder(zips: dict[str, Path], tmp_path: Path) -> None:
    # As in /opt on Lambda: nothing can be written, so only shipped .pyc can spare the compile.
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    with zipfile.ZipFile(zips["x86_64"]) as zf:
        zf.extractall(tmp_path)
    python_dir = tmp_path / "python"
    for path in python_dir.rglob("*"):
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        run = subprocess.run(
            [sys.executable, "-S", "-v", "-c", "import idempotency_layer.stores.dynamodb.client"],
            env={"PYTHONPATH": f"{python_dir / 'lib' / f'python{py}' / 'site-packages'}:{python_dir}"},
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        for path in python_dir.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
    tag = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
    for module in ("__init__", "deadline"):
        assert f"code object from '{python_dir}/idempotency_layer/__pycache__/{module}.{tag}.pyc'" in run.stderr
    for package, modules in (("stores/dynamodb", ("__init__", "client", "connection", "wire", "retry", "errors")),
                             ("aws", ("__init__", "sigv4", "target"))):
        for module in modules:
            shipped = f"{python_dir}/idempotency_layer/{package}/__pycache__/{module}.{tag}.pyc"
            assert f"code object from '{shipped}'" in run.stderr, module


def _rewritten(src_zip: Path, dst_zip: Path, change: dict[str, bytes]) -> None:
    with zipfile.ZipFile(src_zip) as src, zipfile.ZipFile(dst_zip, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, change.get(info.filename, src.read(info)))


def test_verifier_refuses_bytecode_of_another_source(zips: dict[str, Path], tmp_path: Path) -> None:
    # Unchecked-hash .pyc are never compared with their source at import: a source changed after compiling
    # would run as the old bytecode, silently. The verifier checks each .pyc's recorded hash, for every Python.
    stale = tmp_path / "stale.zip"
    name = "python/idempotency_layer/aws/sigv4.py"
    with zipfile.ZipFile(zips["x86_64"]) as zf:
        changed = zf.read(name) + b"\n# changed after compiling\n"
        tags = sorted(n.rsplit(".", 2)[1] for n in zf.namelist() if "/__pycache__/sigv4." in n)
    assert tags, "the build shipped no bytecode to check"
    _rewritten(zips["x86_64"], stale, {name: changed})
    problems = verify_layer.check(stale, "x86_64", PYTHONS, max_bytes=MAX_BYTES)
    assert sorted(p for p in problems if "stale bytecode" in p) == [
        f"python/idempotency_layer/aws/__pycache__/sigv4.{tag}.pyc was not compiled from the source shipped "
        "beside it (stale bytecode)" for tag in tags
    ]
    assert len(problems) == len(tags)


def test_verifier_compiles_this_pythons_bytecode_again(zips: dict[str, Path], tmp_path: Path) -> None:
    # A .pyc whose header claims the right source but whose code is another module's is caught too.
    tag = sys.implementation.cache_tag
    target = f"python/idempotency_layer/aws/__pycache__/sigv4.{tag}.pyc"
    other = f"python/idempotency_layer/aws/__pycache__/target.{tag}.pyc"
    with zipfile.ZipFile(zips["x86_64"]) as zf:
        if target not in zf.namelist():
            pytest.skip(f"the build shipped no bytecode for {tag}")
        forged = zf.read(target)[:16] + zf.read(other)[16:]
    bad = tmp_path / "forged.zip"
    _rewritten(zips["x86_64"], bad, {target: forged})
    assert verify_layer.check(bad, "x86_64", PYTHONS, max_bytes=MAX_BYTES) == [
        f"{target} differs from its source compiled again"
    ]


def interpreters() -> dict[str, str]:
    """The Pythons build.sh compiles bytecode with (bytecode_python: pyenv's, else pythonX.Y on PATH)."""
    found = {}
    for version in PYTHONS:
        script = f'source <(sed -n "/^bytecode_python()/,/^}}/p" build.sh); bytecode_python {version}'
        run = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True)
        if run.returncode == 0 and run.stdout.strip():
            found[version] = run.stdout.strip()
    return found


def test_verifier_refuses_bytecode_of_another_python(zips: dict[str, Path], tmp_path: Path) -> None:
    # 3.11's .pyc under 3.12's name: its recorded hash is right (keyed by its own magic), but 3.12 would refuse
    # it and compile the module at every cold start.
    with zipfile.ZipFile(zips["x86_64"]) as zf:
        names = zf.namelist()
        tags = sorted(n.rsplit(".", 2)[1] for n in names if "/__pycache__/sigv4." in n)
        if len(tags) < 2:
            pytest.skip("the build shipped bytecode for fewer than two Pythons")
        source, target = (f"python/idempotency_layer/aws/__pycache__/sigv4.{tag}.pyc" for tag in tags[:2])
        foreign = zf.read(source)
    bad = tmp_path / "foreign.zip"
    _rewritten(zips["x86_64"], bad, {target: foreign})
    problems = verify_layer.check(bad, "x86_64", PYTHONS, max_bytes=MAX_BYTES)
    assert problems == [f"{target} carries the magic number of another Python than {tags[1]}"]


def test_each_python_compiles_its_own_bytecode_again(zips: dict[str, Path], tmp_path: Path) -> None:
    # A forged .pyc for a Python other than the one running the verifier is caught by that Python.
    found = interpreters()
    assert verify_layer.check(zips["x86_64"], "x86_64", PYTHONS, max_bytes=MAX_BYTES, interpreters=found) == []
    others = {v: p for v, p in found.items() if "cpython-" + v.replace(".", "") != sys.implementation.cache_tag}
    if not others:
        pytest.skip("no Python but this one compiled bytecode")
    version = sorted(others)[0]
    tag = "cpython-" + version.replace(".", "")
    target = f"python/idempotency_layer/aws/__pycache__/sigv4.{tag}.pyc"
    with zipfile.ZipFile(zips["x86_64"]) as zf:
        forged = zf.read(target)[:16] + zf.read(f"python/idempotency_layer/aws/__pycache__/target.{tag}.pyc")[16:]
    bad = tmp_path / "forged.zip"
    _rewritten(zips["x86_64"], bad, {target: forged})
    assert verify_layer.check(bad, "x86_64", PYTHONS, max_bytes=MAX_BYTES, interpreters=others) == [
        f"{target} differs from its source compiled again by {tag}"
    ]


def test_the_source_hash_is_cpythons(tmp_path: Path) -> None:
    # SipHash-1-3 (3.11 on) from this interpreter; SipHash-2-4 (3.10) from a 3.10 when the machine has one.
    import _imp
    import importlib.util

    samples = [b"", b"a", b"abcdefgh", b"x" * 1001, (PACKAGE_SRC / "stores" / "dynamodb" / "client.py").read_bytes()]
    for data in samples:
        key = int.from_bytes(importlib.util.MAGIC_NUMBER, "little")
        assert verify_layer.source_hash(importlib.util.MAGIC_NUMBER, data) == _imp.source_hash(key, data)
    for version in ("3.10", "3.13"):
        interp = subprocess.run(["bash", "-c", f"command -v python{version}"], capture_output=True, text=True)
        if interp.returncode != 0:
            continue
        code = (
            "import _imp, importlib.util, sys; m = importlib.util.MAGIC_NUMBER; print(m.hex()); "
            "print(' '.join(_imp.source_hash(int.from_bytes(m, 'little'), open(p, 'rb').read()).hex() "
            "for p in sys.argv[1:]))"
        )
        files = []
        for i, data in enumerate(samples):
            files.append(tmp_path / f"s{i}")
            files[-1].write_bytes(data)
        run = subprocess.run([interp.stdout.strip(), "-c", code, *map(str, files)], capture_output=True, text=True)
        if run.returncode != 0:
            continue  # a pyenv shim without that version installed
        magic_hex, hashes = run.stdout.split("\n")[:2]
        magic = bytes.fromhex(magic_hex)
        assert [verify_layer.source_hash(magic, d).hex() for d in samples] == hashes.split()


# The wheel for container images (./build.sh wheel, scripts/build_wheel.py).


def _build_wheel() -> Path:
    done = subprocess.run(["bash", str(ROOT / "build.sh"), "wheel"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return ROOT / done.stdout.strip().splitlines()[-1].split(":")[0]


@pytest.fixture(scope="module")
def wheel() -> Path:
    return _build_wheel()


def test_wheel_carries_what_the_zip_carries_at_run_time(zips: dict[str, Path], wheel: Path) -> None:
    # Every file of the zip's python/idempotency_layer but its bytecode (pip compiles at install), byte for byte:
    # the sources and the certificate directories; and nothing else of the package.
    prefix = "python/"
    with zipfile.ZipFile(zips["x86_64"]) as zf:
        layer = {n[len(prefix):]: zf.read(n) for n in zf.namelist()
                 if n.startswith(prefix + "idempotency_layer/") and "__pycache__" not in n.split("/")}
    with zipfile.ZipFile(wheel) as wf:
        packaged = {n: wf.read(n) for n in wf.namelist() if n.startswith("idempotency_layer/")}
        wrapper = wf.read("idempotency_layer-0.1.0.data/scripts/idempotency-wrapper")
    assert sorted(packaged) == sorted(layer)
    assert packaged == layer
    assert sum(1 for n in packaged if "/cacerts/" in n) > 200
    assert wrapper == (ROOT / "wrapper" / "idempotency-wrapper").read_bytes()


def test_wheel_builds_the_same_bytes_again(wheel: Path) -> None:
    first = wheel.read_bytes()
    assert _build_wheel().read_bytes() == first
    with zipfile.ZipFile(wheel) as wf:
        infos = wf.infolist()
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert wheel.name == "idempotency_layer-0.1.0-py3-none-any.whl"


def test_wheel_checker_refuses_a_bad_wheel(wheel: Path, tmp_path: Path) -> None:
    from scripts import build_wheel

    assert build_wheel.check(wheel) == []
    bad = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            if info.filename.endswith(("/scripts/idempotency-wrapper", "/store.py")):
                continue
            data = src.read(info)
            if info.filename.endswith("/METADATA"):
                data = data.replace(b"Requires-Dist: jmespath>=1.0\n", b"")
            dst.writestr(info, data)
        dst.writestr("idempotency_layer/__pycache__/keys.cpython-312.pyc", b"")
    problems = build_wheel.check(bad)
    assert any("store.py missing" in p for p in problems), problems
    assert any("idempotency-wrapper missing" in p for p in problems), problems
    assert any("Requires-Dist jmespath missing" in p for p in problems), problems
    assert any("no bytecode or tests" in p for p in problems), problems
