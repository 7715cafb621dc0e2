#!/usr/bin/env bash
# ./build.sh sam-local: the README's SAM path, end to end, on this machine, from nothing.
# Installs a pinned SAM CLI and AWS CLI (own venvs), Docker and debootstrap when missing, builds a stand-in for
# the Lambda Python base image (scripts/sam-standin.sh), then, inside a private network, mount and PID namespace,
# starts its own dockerd and DynamoDB Local and runs scripts/sam_local_check.py, which runs the README's
# commands and checks what they print and what the table holds. The machine's network is never touched: the
# namespace has only its own loopback and docker0, so nothing can reach real AWS either. Everything started is
# stopped by PID; the namespace ending takes any straggler with it.
# Expects ./build.sh to have built dist/ and the project venv (with the test extra) to exist.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SAM_CLI_VERSION=1.170.0
AWSCLI_VERSION=1.46.3
RUNTIME=3.12 # the examples' Runtime in template.yaml
ARCH=x86_64  # and their Architectures
IMAGE=public.ecr.aws/lambda/python:$RUNTIME-$ARCH
CACHE=${IDEMPOTENCY_TEST_CACHE:-$HOME/.cache/idempotency-layer-tests}/sam
VENV=$ROOT/.venv

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'sam-local: %s\n' "$*" >&2; exit 1; }

tool_venv() { # NAME REQUIREMENT -> the venv's bin folder, created once per pinned version
  local dir=$CACHE/$1
  if [[ ! -f $dir/.ready ]]; then
    log "installing $2 into $dir"
    rm -rf "$dir"
    "$VENV/bin/python" -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$2"
    touch "$dir/.ready"
  fi
  echo "$dir/bin"
}

outside() {
  [[ $(uname -m) == x86_64 ]] || die "the examples are x86_64 functions; this machine is $(uname -m)"
  [[ $(id -u) == 0 ]] || die "needs root: it starts its own dockerd in a private network namespace"
  [[ -x $VENV/bin/python && -f $ROOT/dist/idempotency-layer-$ARCH.zip ]] || die "run ./build.sh test first"
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    log "installing Docker and debootstrap (Debian packages)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io debootstrap \
      iptables iproute2 >/dev/null
  fi
  mkdir -p "$CACHE"
  local sam_bin aws_bin runtime ddb key tar run rc=0
  sam_bin=$(tool_venv "sam-cli-$SAM_CLI_VERSION" "aws-sam-cli==$SAM_CLI_VERSION")
  aws_bin=$(tool_venv "awscli-$AWSCLI_VERSION" "awscli==$AWSCLI_VERSION")
  runtime=$(cd "$ROOT" && "$VENV/bin/python" -c \
    "from tests.support.downloads import runtimes; print(runtimes()['$RUNTIME'])") ||
    die "no Python $RUNTIME runtime (pyenv) for the stand-in image"
  ddb=$(cd "$ROOT" && "$VENV/bin/python" -c "from tests.support.downloads import dynamodb_local; print(dynamodb_local())")

  # The stand-in is rebuilt only when its recipe or what goes into it changes.
  key=$( { cat "$ROOT/scripts/sam-standin.sh" "$ROOT/tests/support/runtime/bootstrap" \
    "$ROOT/tests/support/runtime/bootstrap.py"; "$runtime" -VV; "$runtime" -m pip freeze; } | sha256sum | cut -c1-16)
  tar=$CACHE/standin-python$RUNTIME-$key.tar
  if [[ ! -f $tar ]]; then
    rm -f "$CACHE"/standin-python"$RUNTIME"-*.tar
    "$ROOT/scripts/sam-standin.sh" "$RUNTIME" "$runtime" "$tar"
  fi

  run=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-sam.XXXXXX")
  SAM_BIN=$sam_bin AWS_BIN=$aws_bin RUNTIME_BIN=$(dirname "$runtime") DDB_DIR=$ddb STANDIN_TAR=$tar STANDIN_KEY=$key RUN=$run \
    unshare --net --mount --pid --fork --mount-proc --kill-child -- "$0" --inside || rc=$?
  rm -rf "$run"
  return "$rc"
}

# --- inside the namespaces ---------------------------------------------------------------------------

stop_pid() { # PIDFILE_OR_PID: TERM, wait up to 20 s, then KILL
  local pid=$1 i
  [[ -f $pid ]] && pid=$(cat "$pid")
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 200); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

cleanup_inside() {
  [[ -n ${DDB_PID:-} ]] && stop_pid "$DDB_PID"
  # Keep only the stand-in in the cached data root: SAM tags a new image per layer build.
  if docker info >/dev/null 2>&1; then
    docker container prune -f >/dev/null 2>&1 || true
    docker image ls --format '{{.Repository}}:{{.Tag}}' | grep -vxF "$IMAGE" | xargs -r docker rmi -f >/dev/null 2>&1 || true
    docker image prune -f >/dev/null 2>&1 || true
  fi
  stop_pid "$RUN/dockerd.pid"
  # dockerd leaves an empty docker cgroup per controller; the host's cgroup tree gets no trace of us.
  rmdir /sys/fs/cgroup/*/docker 2>/dev/null || true
}

wait_for() { # SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "$what did not come up within the deadline"
    sleep 0.2
  done
}

inside() {
  ip link set lo up
  mount --make-rprivate /
  trap cleanup_inside EXIT
  # One run at a time owns the cached data root (images persist there between runs).
  exec 9>"$CACHE/.docker.lock"
  flock 9
  export DOCKER_HOST=unix://$RUN/docker.sock
  mkdir -p "$CACHE/docker" "$RUN/exec"
  dockerd --data-root "$CACHE/docker" --exec-root "$RUN/exec" --pidfile "$RUN/dockerd.pid" -H "$DOCKER_HOST" \
    >"$RUN/dockerd.log" 2>&1 &
  wait_for 60 dockerd docker info || { tail -20 "$RUN/dockerd.log" >&2; exit 1; }

  if [[ $(docker image inspect -f '{{index .Config.Labels "idempotency.standin"}}' "$IMAGE" 2>/dev/null) != "$STANDIN_KEY" ]]; then
    log "importing the stand-in as $IMAGE"
    # The base image's environment: its python, libraries and task root.
    docker import \
      --change 'ENV LANG=en_US.UTF-8 TZ=:/etc/localtime LAMBDA_TASK_ROOT=/var/task LAMBDA_RUNTIME_DIR=/var/runtime' \
      --change 'ENV PATH=/var/lang/bin:/usr/local/bin:/usr/bin:/bin:/opt/bin' \
      --change 'ENV LD_LIBRARY_PATH=/var/lang/lib:/lib64:/usr/lib64:/var/runtime:/var/runtime/lib:/var/task:/var/task/lib:/opt/lib' \
      --change "ENV LAMBDA_RUNTIME_PYTHON=/var/lang/bin/python$RUNTIME" \
      --change 'WORKDIR /var/task' --change "LABEL idempotency.standin=$STANDIN_KEY" \
      "$STANDIN_TAR" "$IMAGE" >/dev/null
  fi

  log "starting DynamoDB Local on port 8000 (-sharedDb) inside the namespace"
  # From the run folder: it writes a metadata file into its working directory.
  (cd "$RUN" && exec java -Djava.library.path="$DDB_DIR/DynamoDBLocal_lib" -jar "$DDB_DIR/DynamoDBLocal.jar" \
    -sharedDb -inMemory -port 8000 >"$RUN/dynamodb.log" 2>&1) &
  DDB_PID=$!
  wait_for 60 "DynamoDB Local" bash -c 'exec 3<>/dev/tcp/127.0.0.1/8000'

  mkdir -p "$RUN/home"
  # A scratch HOME keeps SAM's settings, layer cache and Docker config out of the user's; dummy credentials
  # because DynamoDB Local accepts any (and real ones must never be needed); `sam build` wants a python3.12.
  HOME=$RUN/home PATH=$SAM_BIN:$AWS_BIN:$RUNTIME_BIN:$PATH SAM_CLI_TELEMETRY=0 \
    AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local AWS_DEFAULT_REGION=us-east-1 AWS_REGION=us-east-1 \
    "$VENV/bin/python" "$ROOT/scripts/sam_local_check.py" --repo "$ROOT" --work "$RUN/work"
}

if [[ ${1:-} == --inside ]]; then inside; else outside; fi
