"""Make the hashed certificate directories the layer trusts instead of loading a whole CA bundle at init.

Usage: cacert_dirs.py OUT_DIR [--scan DIR]... [BUNDLE]...

For each bundle (the given files; certifi's and botocore's cacert.pem as this Python finds them; and any
certifi/cacert.pem or botocore/cacert.pem under each --scan DIR, as a layer built with boto3 ships), writes
OUT_DIR/<sha256 of the bundle file>/<subject hash>.<n>: each certificate OpenSSL itself reads from the file
(`SSLContext.load_verify_locations(cafile=...)` then `get_ca_certs(binary_form=True)`: never PEM blocks picked
out by hand), as PEM, under the name OpenSSL's `capath` lookup opens (`openssl rehash`'s hash). Same subject
hash: .0, .1, ... in the order the certificates first appear in the file. The output depends only on the
bundles' bytes. A bundle whose reading a directory cannot reproduce (CRLs, trust settings, certificates that are
not CAs) gets none: the layer then loads it as a file, as before.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

_PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----\s*(.+?)\s*-----END CERTIFICATE-----", re.S)


class Unsuitable(Exception):
    """The bundle holds something a directory of plain certificates would not reproduce."""


def openssl_certificates(bundle: bytes) -> list[bytes]:
    """The DER certificates OpenSSL loads from `bundle`, in the order they first appear in it."""
    if b"TRUSTED CERTIFICATE" in bundle:
        # OpenSSL keeps such a block's trust and rejection settings; get_ca_certs' DER drops them.
        raise Unsuitable("it holds TRUSTED CERTIFICATE blocks (trust settings a plain certificate loses)")
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "bundle.pem")
        with open(path, "wb") as f:
            f.write(bundle)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(cafile=path)
    stats = context.cert_store_stats()
    found = context.get_ca_certs(binary_form=True)
    if stats["crl"]:
        raise Unsuitable("it holds CRLs")
    if stats["x509"] != len(found):  # get_ca_certs leaves out what X509_check_ca refuses; the file trusts them
        raise Unsuitable(f"{stats['x509'] - len(found)} of its certificates are not CAs")
    # Order only: the content is OpenSSL's. A certificate the hand reading misses goes last, in OpenSSL's order.
    order: dict[bytes, int] = {}
    for match in _PEM_BLOCK.finditer(bundle):
        try:
            der = base64.b64decode(b"".join(match.group(1).split()), validate=True)
        except ValueError:
            continue
        order.setdefault(der, len(order))
    return sorted(found, key=lambda der: order.get(der, len(order)))


def subject_hashes(certificates: list[bytes]) -> list[str]:
    """OpenSSL's subject-name hash (`openssl x509 -hash`) of each certificate, in one `openssl rehash` run."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the openssl command is needed to name the certificates by their subject hash")
    with tempfile.TemporaryDirectory() as scratch:
        for i, der in enumerate(certificates):
            Path(scratch, f"c{i:05d}.pem").write_text(ssl.DER_cert_to_PEM_cert(der))
        subprocess.run([openssl, "rehash", scratch], check=True, capture_output=True)
        hashes: dict[int, str] = {}
        for name in os.listdir(scratch):
            link = os.path.join(scratch, name)
            if os.path.islink(link):
                target = os.readlink(link)
                hashes[int(target[1:6])] = name.split(".")[0]
    missing = [i for i in range(len(certificates)) if i not in hashes]
    if missing:
        raise RuntimeError(f"openssl rehash named no link for {len(missing)} certificate(s)")
    return [hashes[i] for i in range(len(certificates))]


def make_dir(bundle_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """Write the directory for one bundle file (replacing any of the same name); return it.

    Raises Unsuitable when the bundle cannot be reproduced by a directory."""
    bundle = Path(bundle_path).read_bytes()
    certificates = openssl_certificates(bundle)
    target = Path(out_dir) / hashlib.sha256(bundle).hexdigest()
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    used: dict[str, int] = {}
    for der, name in zip(certificates, subject_hashes(certificates), strict=True):
        n = used.get(name, 0)
        used[name] = n + 1
        (target / f"{name}.{n}").write_text(ssl.DER_cert_to_PEM_cert(der))
    return target


def default_bundles(scan: list[Path], host: bool = True) -> list[Path]:
    """certifi's and botocore's cacert.pem as this Python imports them (unless not `host`), and those under each
    scanned folder."""
    from importlib.util import find_spec

    found = []
    for package in ("certifi", "botocore") if host else ():
        try:
            spec = find_spec(package)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            found.append(Path(location) / "cacert.pem")
    for folder in scan:
        found.extend(sorted(folder.glob("*/cacert.pem")))
    return [p for p in found if p.is_file() and p.parent.name in ("certifi", "botocore")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--scan", type=Path, action="append", default=[], help="a folder with packages (certifi, ...)")
    ap.add_argument("--no-host", action="store_true", help="only the scanned folders, not this Python's packages")
    ap.add_argument("bundles", type=Path, nargs="*")
    args = ap.parse_args(argv)
    bundles = list(args.bundles) + default_bundles(args.scan, host=not args.no_host)
    shutil.rmtree(args.out, ignore_errors=True)
    made: set[str] = set()
    for bundle in bundles:
        try:
            target = make_dir(bundle, args.out)
        except (Unsuitable, ssl.SSLError) as why:  # SSLError: OpenSSL cannot read it, so neither can the layer
            print(f"cacert_dirs: no directory for {bundle}: {why}; the layer loads it as a file", file=sys.stderr)
            continue
        if target.name not in made:
            made.add(target.name)
            print(f"cacert_dirs: {bundle} -> {target.name[:12]}... ({len(os.listdir(target))} certificates)",
                  file=sys.stderr)
    if not made:
        print("cacert_dirs: no CA bundle found (no certifi or botocore here): every bundle loads as a file",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
