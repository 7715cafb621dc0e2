#!/usr/bin/env bash
# Build the local stand-in for AWS's Lambda Python base image as a root file system tarball.
#   scripts/sam-standin.sh PYTHON_VERSION RUNTIME_VENV_PYTHON OUT_TAR
# There is no container registry here, so `sam local` cannot pull public.ecr.aws/lambda/python. The stand-in
# proves SAM's wiring (template, layer in /opt, the wrapper variable, handler path, endpoint override), not the
# runtime: a Debian minbase root, the machine's CPython of that version in /var/lang, awslambdaric and boto3
# beside it, and the tests' stand-in /var/runtime/bootstrap, which honours AWS_LAMBDA_EXEC_WRAPPER as the
# managed runtime's does. The caller imports it with the base image's environment (scripts/sam-local.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=${1:?python version, e.g. 3.12}
runtime_python=${2:?the python of a venv holding awslambdaric and boto3 for that version}
out=${3:?output tarball}

SUITE=bookworm # the machine's own Debian release, so the copied CPython finds the libraries it was built with
MIRROR=http://deb.debian.org/debian
# What the CPython build's extension modules link against, beyond minbase.
LIBS=libssl3,libffi8,libsqlite3-0,libbz2-1.0,libreadline8,libexpat1,libnsl2,libtirpc3

prefix=$("$runtime_python" -c 'import sys; print(sys.base_prefix)')
[[ -x $prefix/bin/python$version ]] || { echo "sam-standin: no python$version in $prefix" >&2; exit 1; }
site=$("$runtime_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

work=$(mktemp -d "$(dirname "$out")/standin.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root

echo "==> debootstrap $SUITE (minbase) for the python$version stand-in" >&2
debootstrap --variant=minbase --include="$LIBS" "$SUITE" "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
  { tail -20 "$work/debootstrap.log" >&2; exit 1; }
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc "$root"/usr/share/man

# CPython, without what a function never imports; the base image keeps it in /var/lang too.
mkdir -p "$root/var/lang"
tar -C "$prefix" --exclude='lib/python*/test' --exclude='lib/python*/idlelib' --exclude='lib/python*/tkinter' \
  --exclude='lib/python*/turtledemo' --exclude='lib/python*/site-packages' --exclude=__pycache__ -cf - . |
  tar -C "$root/var/lang" -xf -
mkdir -p "$root/var/lang/lib/python$version/site-packages"
# awslambdaric and boto3 from the tests' runtime venv of the same version (the runtime's client and its SDK).
tar -C "$site" --exclude='pip' --exclude='pip-*' --exclude=__pycache__ -cf - . |
  tar -C "$root/var/lang/lib/python$version/site-packages" -xf -

mkdir -p "$root/var/runtime" "$root/var/task" "$root/opt"
install -m 0755 "$ROOT/tests/support/runtime/bootstrap" "$root/var/runtime/bootstrap"
install -m 0644 "$ROOT/tests/support/runtime/bootstrap.py" "$root/var/runtime/bootstrap.py"

tar -C "$root" --numeric-owner -cf "$out.tmp" .
mv "$out.tmp" "$out"
echo "==> stand-in root file system: $out ($(du -h "$out" | cut -f1))" >&2
