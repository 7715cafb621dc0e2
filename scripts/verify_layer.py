"""Check a built layer zip's layout; exit non-zero listing every mismatch.

Usage: verify_layer.py --arch x86_64|arm64 [--package-src DIR] [--orjson-version V] [--pythons "3.10 ..."]
                       [--max-bytes N] [--with-boto3] ZIP
"""

from __future__ import annotations

import argparse
import re
import stat
import sys
import zipfile
from pathlib import Path

WRAPPER = "idempotency-wrapper"
PACKAGE = "python/idempotency_layer"
MACHINE = {"x86_64": "x86_64", "arm64": "aarch64"}  # Lambda's name -> the name in CPython's .so suffix


def _package_pyc(name: str, data: bytes, pythons: list[str]) -> str | None:
    """The cache tag (`cpython-312`) of an unchecked-hash .pyc of one of the package's modules, else None."""
    match = re.fullmatch(rf"{PACKAGE}/(?:[^/]+/)*__pycache__/[A-Za-z_][A-Za-z0-9_]*\.(cpython-3\d+)\.pyc", name)
    if match is None or match.group(1) not in {"cpython-" + py.replace(".", "") for py in pythons}:
        return None
    # PEP 552 header: magic (4 bytes), flags (4: 0b01 = hash-based, source not checked), source hash (8).
    if len(data) < 16 or int.from_bytes(data[4:8], "little") != 0b01:
        return None
    return match.group(1)


# The .pyc magic numbers each CPython release line uses (Lib/importlib/_bootstrap_external.py): a .pyc named
# for one Python but compiled by another would be refused by its importer, so the layer would compile at every
# cold start again, silently.
MAGIC_RANGES = {
    "cpython-310": range(3430, 3440),
    "cpython-311": range(3450, 3496),
    "cpython-312": range(3500, 3532),
    "cpython-313": range(3550, 3572),
    "cpython-314": range(3600, 3650),
}

# Run by each Python the build compiled with: its own .pyc in the zip must carry its magic number and be its
# compile of the source beside it, code object for code object. Prints one problem per line.
_RECOMPILE = """
import importlib.util, marshal, sys, zipfile
zf = zipfile.ZipFile(sys.argv[1])
tag = sys.implementation.cache_tag
for name in zf.namelist():
    if not name.endswith("." + tag + ".pyc"):
        continue
    data = zf.read(name)
    folder, _, rest = name.partition("/__pycache__/")
    source_name = folder + "/" + rest.split(".", 1)[0] + ".py"
    if data[:4] != importlib.util.MAGIC_NUMBER:
        print(name + " carries another Python's magic number than " + tag + "'s")
    elif source_name in zf.namelist():
        code = compile(zf.read(source_name), "/opt/" + source_name, "exec", dont_inherit=True)
        if marshal.loads(data[16:]) != code:
            print(name + " differs from its source compiled again by " + tag)
"""


def recompiled(zip_path: Path, interpreter: str) -> list[str]:
    """What `interpreter` finds wrong with its own .pyc in the zip (see `_RECOMPILE`)."""
    import subprocess

    run = subprocess.run([interpreter, "-I", "-c", _RECOMPILE, str(zip_path)], capture_output=True, text=True,
                         timeout=120)
    if run.returncode != 0:
        return [f"{interpreter} could not check its bytecode: {run.stderr.strip()[-300:]}"]
    return run.stdout.splitlines()


_MASK = (1 << 64) - 1
_FIRST_SIPHASH13_MAGIC = 3495  # CPython 3.11 moved _Py_KeyedHash (the .pyc source hash) from SipHash-2-4 to 1-3


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def siphash(key: int, data: bytes, c_rounds: int) -> bytes:
    """SipHash-c-4 with k0 = `key`, k1 = 0, as CPython's _Py_KeyedHash computes a .pyc's source hash."""
    v = [0x736F6D6570736575 ^ key, 0x646F72616E646F6D, 0x6C7967656E657261 ^ key, 0x7465646279746573]

    def rounds(n: int) -> None:
        for _ in range(n):
            v[0] = (v[0] + v[1]) & _MASK
            v[1] = _rotl(v[1], 13) ^ v[0]
            v[0] = _rotl(v[0], 32)
            v[2] = (v[2] + v[3]) & _MASK
            v[3] = _rotl(v[3], 16) ^ v[2]
            v[0] = (v[0] + v[3]) & _MASK
            v[3] = _rotl(v[3], 21) ^ v[0]
            v[2] = (v[2] + v[1]) & _MASK
            v[1] = _rotl(v[1], 17) ^ v[2]
            v[2] = _rotl(v[2], 32)

    tail = len(data) % 8
    for i in range(0, len(data) - tail, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v[3] ^= m
        rounds(c_rounds)
        v[0] ^= m
    m = ((len(data) & 0xFF) << 56) | int.from_bytes(data[len(data) - tail :], "little")
    v[3] ^= m
    rounds(c_rounds)
    v[0] ^= m
    v[2] ^= 0xFF
    rounds(4 if c_rounds == 2 else 3)
    return ((v[0] ^ v[1] ^ v[2] ^ v[3]) & _MASK).to_bytes(8, "little")


def source_hash(magic: bytes, source: bytes) -> bytes:
    """The source hash a CPython whose .pyc magic is `magic` records, whatever Python runs this."""
    number = int.from_bytes(magic[:2], "little")
    return siphash(int.from_bytes(magic, "little"), source, 1 if number >= _FIRST_SIPHASH13_MAGIC else 2)


def _stale_pyc(name: str, data: bytes, source: bytes | None) -> str | None:
    """What is wrong with a package .pyc against the source shipped beside it, or None.

    Every .pyc records the SipHash of the source it was compiled from, keyed by its Python's magic number: an
    unchecked-hash .pyc is never compared with its source at import, so a stale one would run silently. Here
    each is checked for every Python (the hash function takes the key, so any interpreter can compute it),
    and one of this interpreter's version is compiled again and compared code object for code object.
    """
    import importlib.util
    import marshal

    if source is None:
        return f"{name} has no source beside it"
    tag = name.rsplit(".", 2)[1]
    if int.from_bytes(data[:2], "little") not in MAGIC_RANGES.get(tag, ()):
        return f"{name} carries the magic number of another Python than {tag}"
    if source_hash(data[:4], source) != data[8:16]:
        return f"{name} was not compiled from the source shipped beside it (stale bytecode)"
    if data[:4] == importlib.util.MAGIC_NUMBER:
        folder, _, rest = name.partition("/__pycache__/")
        dfile = f"/opt/{folder}/{rest.split('.', 1)[0]}.py"
        if marshal.loads(data[16:]) != compile(source, dfile, "exec", dont_inherit=True):
            return f"{name} differs from its source compiled again"
    return None


def check(
    zip_path: Path,
    arch: str,
    pythons: list[str],
    package_src: Path | None = None,
    orjson_version: str | None = None,
    max_bytes: int | None = None,
    with_boto3: bool = False,
    interpreters: dict[str, str] | None = None,
) -> list[str]:
    """Return the list of problems found in the zip (empty when it is fine). `interpreters` (version ->
    executable) each compile their own Python's .pyc again and compare."""
    problems: list[str] = []
    with zipfile.ZipFile(zip_path) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        names = sorted(infos)

        wrapper = infos.get(WRAPPER)
        if wrapper is None:
            problems.append(f"{WRAPPER} missing at the zip root")
        else:
            mode = wrapper.external_attr >> 16
            if stat.S_IMODE(mode) != 0o755 or not stat.S_ISREG(mode):
                problems.append(f"{WRAPPER} mode is {oct(mode)}, want 0o100755")
            body = zf.read(wrapper)
            if not body.startswith(b"#!/bin/bash\n"):
                problems.append(f"{WRAPPER} does not start with #!/bin/bash")
            if b"\r" in body:
                problems.append(f"{WRAPPER} has CR line endings")

        if f"{PACKAGE}/__init__.py" not in infos:
            problems.append(f"{PACKAGE}/__init__.py missing")
        if package_src is not None:
            for src in sorted(package_src.rglob("*.py")):
                rel = src.relative_to(package_src)
                if "__pycache__" in rel.parts or rel.parts[0] in ("tests", "test"):
                    continue
                if f"{PACKAGE}/{rel.as_posix()}" not in infos:
                    problems.append(f"{PACKAGE}/{rel.as_posix()} missing (present in {package_src})")

        machine = MACHINE[arch]
        for py in pythons:
            site = f"python/lib/python{py}/site-packages"
            so = f"{site}/orjson/orjson.cpython-{py.replace('.', '')}-{machine}-linux-gnu.so"
            if so not in infos:
                problems.append(f"{so} missing")
            if orjson_version and f"{site}/orjson-{orjson_version}.dist-info/METADATA" not in infos:
                problems.append(f"{site}: orjson {orjson_version} dist-info missing")

        other = {m for a, m in MACHINE.items() if a != arch}
        modules = [n[len(PACKAGE) + 1 : -3] for n in names if n.startswith(PACKAGE + "/") and n.endswith(".py")]
        tags: set[str] = set()
        for name in names:
            parts = name.split("/")
            if name.endswith(".pyc") or "__pycache__" in parts:
                tag = _package_pyc(name, zf.read(infos[name]), pythons)
                if tag is None:
                    problems.append(f"compiled file {name} (only unchecked-hash .pyc of the package's modules)")
                else:
                    tags.add(tag)
                    folder, _, rest = name.partition("/__pycache__/")
                    source_name = f"{folder}/{rest.split('.', 1)[0]}.py"
                    source = zf.read(infos[source_name]) if source_name in infos else None
                    stale = _stale_pyc(name, zf.read(infos[name]), source)
                    if stale is not None:
                        problems.append(stale)
            if any(p in ("tests", "test") for p in parts[:-1]):
                problems.append(f"test file {name}")
            if name.endswith(".so") and any(re.search(rf"[-_.]{m}[-_.]", parts[-1]) for m in other):
                problems.append(f"wrong-architecture binary {name}")

        for tag in sorted(tags):  # a Python with bytecode has it for every module
            for module in modules:
                folder, _, stem = module.rpartition("/")
                pyc = f"{PACKAGE}/{folder + '/' if folder else ''}__pycache__/{stem}.{tag}.pyc"
                if pyc not in infos:
                    problems.append(f"{pyc} missing ({tag} has bytecode for other modules)")

        has_boto3 = "python/boto3/__init__.py" in infos and "python/botocore/__init__.py" in infos
        if with_boto3 and not has_boto3:
            problems.append("boto3/botocore missing under python/ (built with --with-boto3)")
        if not with_boto3 and any(n.startswith(("python/boto3/", "python/botocore/")) for n in names):
            problems.append("boto3/botocore bundled but not asked for (the runtime provides them)")

        unzipped = sum(i.file_size for i in infos.values())
    for version, interpreter in sorted((interpreters or {}).items()):
        if "cpython-" + version.replace(".", "") in tags:
            problems.extend(recompiled(zip_path, interpreter))
    zipped = zip_path.stat().st_size
    if max_bytes is not None and zipped >= max_bytes:
        problems.append(f"zip is {zipped} bytes, over the {max_bytes}-byte budget")
    print(
        f"{zip_path}: {arch}, {len(names)} files, {zipped / 1024:.0f} KiB zipped, "
        f"{unzipped / 1024:.0f} KiB unzipped, orjson for Python {' '.join(pythons)}"
        + (", boto3 bundled" if has_boto3 else "")
        + (": OK" if not problems else f": {len(problems)} problem(s)")
    )
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("zip", type=Path)
    ap.add_argument("--arch", required=True, choices=sorted(MACHINE))
    ap.add_argument("--pythons", default="3.10 3.11 3.12 3.13 3.14", help="space-separated versions")
    ap.add_argument("--package-src", type=Path, help="source package dir whose .py files must all be in")
    ap.add_argument("--orjson-version")
    ap.add_argument("--max-bytes", type=int)
    ap.add_argument("--with-boto3", action="store_true")
    ap.add_argument("--interpreter", action="append", default=[], metavar="VERSION=PATH",
                    help="a Python that compiled bytecode for the zip: it compiles it again to compare")
    args = ap.parse_args(argv)
    problems = check(
        args.zip,
        args.arch,
        args.pythons.split(),
        package_src=args.package_src,
        orjson_version=args.orjson_version,
        max_bytes=args.max_bytes,
        with_boto3=args.with_boto3,
        interpreters=dict(item.split("=", 1) for item in args.interpreter),
    )
    for p in problems:
        print(f"  FAIL: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
