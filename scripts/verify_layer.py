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


def check(
    zip_path: Path,
    arch: str,
    pythons: list[str],
    package_src: Path | None = None,
    orjson_version: str | None = None,
    max_bytes: int | None = None,
    with_boto3: bool = False,
) -> list[str]:
    """Return the list of problems found in the zip (empty when it is fine)."""
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
        for name in names:
            parts = name.split("/")
            if name.endswith(".pyc") or "__pycache__" in parts:
                problems.append(f"compiled file {name}")
            if any(p in ("tests", "test") for p in parts[:-1]):
                problems.append(f"test file {name}")
            if name.endswith(".so") and any(re.search(rf"[-_.]{m}[-_.]", parts[-1]) for m in other):
                problems.append(f"wrong-architecture binary {name}")

        has_boto3 = "python/boto3/__init__.py" in infos and "python/botocore/__init__.py" in infos
        if with_boto3 and not has_boto3:
            problems.append("boto3/botocore missing under python/ (built with --with-boto3)")
        if not with_boto3 and any(n.startswith(("python/boto3/", "python/botocore/")) for n in names):
            problems.append("boto3/botocore bundled but not asked for (the runtime provides them)")

        unzipped = sum(i.file_size for i in infos.values())
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
    args = ap.parse_args(argv)
    problems = check(
        args.zip,
        args.arch,
        args.pythons.split(),
        package_src=args.package_src,
        orjson_version=args.orjson_version,
        max_bytes=args.max_bytes,
        with_boto3=args.with_boto3,
    )
    for p in problems:
        print(f"  FAIL: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
