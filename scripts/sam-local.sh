#!/usr/bin/env bash
# ./build.sh sam-local: the README's SAM path, end to end, on this machine, from nothing.
# Installs a pinned SAM CLI and AWS CLI (own venvs), Docker and debootstrap when missing, builds a stand-in for
# the Lambda Python base image (scripts/sam-standin.sh), then, inside private network, mount and PID
# namespaces, starts its own dockerd and DynamoDB Local and runs scripts/sam_local_check.py, which runs the
# README's commands and checks what they print and what the table holds. The namespace has only its own
# loopback and docker0, so the machine's network is not touched and nothing can reach AWS; /run, /etc/docker
# and the containers' cgroups are its own too. Everything is stopped by PID; if this script is killed, the
# kernel takes the namespace down with it (parent-death signals on unshare and on the namespace's init).
# Expects ./build.sh to have built dist/ and the project venv (with the test extra) to exist.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SAM_CLI_VERSION=1.170.0
AWSCLI_VERSION=1.46.3
RUNTIME=3.12 # the examples' Runtime in template.yaml
ARCH=x86_64  # and their Architectures
IMAGE=public.ecr.aws/lambda/python:$RUNTIME-$ARCH
CACHE=${IDEMLAYER_TEST_CACHE:-$HOME/.cache/idempotency-layer-tests}/sam
CGROUP_PARENT=idempotency-sam # the containers' cgroups live under this name, ours to clean up
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

install_packages() {
  log "installing Docker and debootstrap (Debian packages)"
  # The package would start (and on systemd machines enable) the machine's own Docker, with its bridge and
  # NAT rules; this run needs only the binaries, so no service is started.
  local policy=/usr/sbin/policy-rc.d ours=0 rc=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
    ours=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io debootstrap \
    iptables iproute2 util-linux >/dev/null || rc=$?
  ((ours)) && rm -f "$policy"
  ((rc == 0)) || die "apt-get install failed ($rc)"
  if [[ -d /run/systemd/system ]]; then
    systemctl disable docker.service docker.socket >/dev/null 2>&1 || true
  fi
}

outside() {
  [[ $(uname -m) == x86_64 ]] || die "the examples are x86_64 functions; this machine is $(uname -m)"
  [[ $(id -u) == 0 ]] || die "needs root: it starts its own dockerd in a private network namespace"
  [[ -x $VENV/bin/python && -f $ROOT/dist/idempotency-layer-$ARCH.zip ]] || die "run ./build.sh test first"
  command -v dockerd >/dev/null && command -v debootstrap >/dev/null || install_packages
  mkdir -p "$CACHE"
  local sam_bin aws_bin runtime ddb key tar rc=0
  # Two first runs on one machine would install and build the same things at once.
  exec 8>"$CACHE/.setup.lock"
  flock 8
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
  flock -u 8

  RUN=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-sam.XXXXXX")
  trap 'rm -rf "$RUN"' EXIT
  # A signal to this script reaches the namespace: unshare dies, and its child (the namespace's init) with it.
  trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid"; exit 143' TERM HUP
  trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid"; exit 130' INT
  SAM_BIN=$sam_bin AWS_BIN=$aws_bin RUNTIME_BIN=$(dirname "$runtime") DDB_DIR=$ddb STANDIN_TAR=$tar \
    STANDIN_KEY=$key RUN=$RUN setpriv --pdeathsig KILL -- \
    unshare --net --mount --pid --fork --mount-proc --kill-child=KILL -- "$0" --inside &
  local pid=$!
  wait "$pid" || rc=$?
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

remove_cgroups() { # depth first, only under our own parent: an empty cgroup is all rmdir removes
  local dir
  for dir in /sys/fs/cgroup/*/"$CGROUP_PARENT"; do
    [[ -d $dir ]] || continue
    find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

show_logs() {
  local log
  for log in "$RUN"/dockerd.log "$RUN"/dynamodb.log; do
    [[ -s $log ]] && { echo "--- $(basename "$log") (tail) ---"; tail -20 "$log"; } >&2
  done
}

cleanup_inside() {
  local rc=$?
  ((rc == 0)) || show_logs
  [[ -n ${DDB_PID:-} ]] && stop_pid "$DDB_PID"
  # Keep only the stand-in in the cached data root: SAM tags a new image per layer build.
  if docker info >/dev/null 2>&1; then
    docker container prune -f >/dev/null 2>&1 || true
    docker image ls --format '{{.Repository}}:{{.Tag}}' | grep -vxF "$IMAGE" | xargs -r docker rmi -f >/dev/null 2>&1 || true
    docker image prune -f >/dev/null 2>&1 || true
  fi
  stop_pid /run/isam/dockerd.pid
  remove_cgroups
}

wait_for() { # SECONDS COMMAND...: 0 once COMMAND succeeds, 1 at the deadline
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

inside() {
  ip link set lo up
  mount --make-rprivate /
  # Our own /run (dockerd's and containerd's sockets and state: short paths, gone with the namespace) and
  # /etc/docker (the machine's daemon.json must not steer this daemon, nor may it write its key there).
  mount -t tmpfs tmpfs /run
  [[ -d /etc/docker ]] && mount -t tmpfs tmpfs /etc/docker
  mkdir -p /run/isam
  echo '{}' >/run/isam/daemon.json
  trap cleanup_inside EXIT
  remove_cgroups # what a killed earlier run left
  # One run at a time owns the cached data root (images persist there between runs).
  exec 9>"$CACHE/.docker.lock"
  flock 9
  export DOCKER_HOST=unix:///run/isam/docker.sock
  mkdir -p "$CACHE/docker"
  setsid dockerd --config-file /run/isam/daemon.json --data-root "$CACHE/docker" --exec-root /run/isam/exec \
    --pidfile /run/isam/dockerd.pid -H "$DOCKER_HOST" --cgroup-parent "/$CGROUP_PARENT" \
    >"$RUN/dockerd.log" 2>&1 </dev/null &
  wait_for 60 docker info || die "dockerd did not answer within 60 s"

  if [[ $(docker image inspect -f '{{index .Config.Labels "idempotency.standin"}}' "$IMAGE" 2>/dev/null) != "$STANDIN_KEY" ]]; then
    log "importing the stand-in as $IMAGE"
    # The base image's environment: its python, libraries, task root and execution environment name.
    docker import \
      --change 'ENV LANG=en_US.UTF-8 TZ=:/etc/localtime LAMBDA_TASK_ROOT=/var/task LAMBDA_RUNTIME_DIR=/var/runtime' \
      --change "ENV AWS_EXECUTION_ENV=AWS_Lambda_python$RUNTIME" \
      --change 'ENV PATH=/var/lang/bin:/usr/local/bin:/usr/bin:/bin:/opt/bin' \
      --change 'ENV LD_LIBRARY_PATH=/var/lang/lib:/lib64:/usr/lib64:/var/runtime:/var/runtime/lib:/var/task:/var/task/lib:/opt/lib' \
      --change "ENV LAMBDA_RUNTIME_PYTHON=/var/lang/bin/python$RUNTIME" \
      --change 'WORKDIR /var/task' --change "LABEL idempotency.standin=$STANDIN_KEY" \
      "$STANDIN_TAR" "$IMAGE" >/dev/null
  fi

  log "starting DynamoDB Local on port 8000 (-sharedDb) inside the namespace"
  # From the run folder, with its temporary files there too: it writes a metadata file into its working
  # directory and its native library into java.io.tmpdir.
  (cd "$RUN" && exec java -Djava.io.tmpdir="$RUN" -XX:-UsePerfData \
    -Djava.library.path="$DDB_DIR/DynamoDBLocal_lib" -jar "$DDB_DIR/DynamoDBLocal.jar" \
    -sharedDb -inMemory -disableTelemetry -port 8000 >"$RUN/dynamodb.log" 2>&1 </dev/null) &
  DDB_PID=$!
  wait_for 60 bash -c 'exec 3<>/dev/tcp/127.0.0.1/8000' || die "DynamoDB Local did not listen within 60 s"

  mkdir -p "$RUN/home"
  # A scratch HOME keeps SAM's settings, layer cache and Docker config out of the user's; no AWS_* from the
  # caller (the README's block sets what it needs); `sam build` wants a python3.12.
  env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_REGION -u AWS_DEFAULT_REGION \
    -u AWS_PROFILE -u AWS_ENDPOINT_URL -u AWS_ENDPOINT_URL_DYNAMODB -u SAM_CLI_TELEMETRY \
    HOME="$RUN/home" TMPDIR="$RUN" PATH="$SAM_BIN:$AWS_BIN:$RUNTIME_BIN:$PATH" \
    "$VENV/bin/python" "$ROOT/scripts/sam_local_check.py" --repo "$ROOT" --work "$RUN/work"
}

if [[ ${1:-} == --inside ]]; then inside; else outside; fi
