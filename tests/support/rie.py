"""Run a Python function the way Lambda does, locally: the Runtime Interface Emulator (RIE) in front of
awslambdaric, started through our stand-in for the managed runtime's bootstrap (`runtime/bootstrap`), or
as a container image would (`[wrapper] python -m awslambdaric HANDLER`).

The layer under test is the built zip (`dist/idempotency-layer-<arch>.zip`), unpacked into a folder that
stands in for /opt (`LAMBDA_OPT_DIR`).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import platform
import signal
import subprocess
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from . import downloads
from .dynamodb_local import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
INVOKE_PATH = "/2015-03-31/functions/function/invocations"
START_TIMEOUT = 20.0
WRAPPER_NAME = "idempotency-wrapper"
# Inherited from the test process; everything else the function sees is set explicitly.
_INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")


def lambda_arch() -> str:
    """Lambda's name for this machine's architecture."""
    return "arm64" if platform.machine() in ("aarch64", "arm64") else "x86_64"


def layer_zip(root: Path = ROOT) -> Path:
    return root / "dist" / f"idempotency-layer-{lambda_arch()}.zip"


def _newest_source(root: Path) -> float:
    newest = 0.0
    for folder in (root / "layer", root / "wrapper"):
        for path in folder.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                newest = max(newest, path.stat().st_mtime)
    return newest


def layer_is_stale(root: Path = ROOT) -> bool:
    """Whether the zip is missing or older than any file of layer/ or wrapper/."""
    zip_path = layer_zip(root)
    return not zip_path.exists() or zip_path.stat().st_mtime < _newest_source(root)


def ensure_layer(root: Path = ROOT) -> Path:
    """The built layer zip, running `./build.sh build` first when it is missing or stale."""
    if not layer_is_stale(root):
        return layer_zip(root)
    with downloads._locked("build"):  # two test runs at once build once
        if layer_is_stale(root):
            done = subprocess.run([str(root / "build.sh"), "build"], cwd=root, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"./build.sh build failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return layer_zip(root)


def unpack_layer(zip_path: Path, dest: Path) -> Path:
    """Unzip like Lambda does into /opt: `zipfile` drops mode bits, so restore them from the entries."""
    with zipfile.ZipFile(zip_path) as archive:
        for info in archive.infolist():
            target = Path(archive.extract(info, dest))
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                target.chmod(mode)
    return dest


class Invocation(NamedTuple):
    """What RIE answered: HTTP status, the exact body bytes and the headers (unpacks as a 3-tuple)."""

    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error_type(self) -> str | None:
        """`errorType` when the body is Lambda's error shape, else None."""
        try:
            value = json.loads(self.body)
        except ValueError:
            return None
        if isinstance(value, dict) and "errorType" in value and "errorMessage" in value:
            return value["errorType"]
        return None

    @property
    def error_message(self) -> str:
        return str(self.json()["errorMessage"]) if self.error_type else ""


def _session_members(sid: int) -> list[int]:
    """PIDs of the live (not zombie) processes in session `sid`, from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # exited while we looked
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _version_of(python: Path) -> str:
    done = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


class LambdaEnvironment:
    """One execution environment: an RIE process and the runtime it starts (one invocation at a time).

    `image=False` runs our managed-runtime bootstrap (`AWS_LAMBDA_EXEC_WRAPPER` honoured, as on Lambda);
    `image=True` runs `[opt/idempotency-wrapper] python -m awslambdaric HANDLER` like a container image's
    ENTRYPOINT + CMD, with the layer's folders on PYTHONPATH as the image's Dockerfile would set them.
    """

    def __init__(
        self,
        python: Path,
        task_root: Path,
        *,
        version: str | None = None,
        handler: str = "app.handler",
        env: Mapping[str, str] | None = None,
        opt_dir: Path | None = None,
        wrapper: bool = True,
        image: bool = False,
        timeout: int = 30,
        function_name: str = "idempotency-e2e",
        log_path: Path | None = None,
    ) -> None:
        if wrapper and opt_dir is None:
            raise ValueError("the wrapper lives in the layer: pass opt_dir")
        self.python = python
        self.python_version = version or _version_of(python)
        self.task_root = task_root
        self.handler = handler
        self.opt_dir = opt_dir
        self.wrapper = wrapper
        self.image = image
        self.timeout = timeout
        self.function_name = function_name
        self.extra_env = dict(env or {})
        self.log_path = log_path or task_root / f"rie-{os.getpid()}-{id(self)}.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}{INVOKE_PATH}"

    def environment(self, api_port: int) -> dict[str, str]:
        env = {name: os.environ[name] for name in _INHERITED if name in os.environ}
        env.update({
            "AWS_LAMBDA_FUNCTION_NAME": self.function_name,
            "AWS_LAMBDA_FUNCTION_TIMEOUT": str(self.timeout),
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
            "LAMBDA_TASK_ROOT": str(self.task_root),
            "PYTHONDONTWRITEBYTECODE": "1",  # keep the task root and the unpacked layer as they were
            "PYTHONUNBUFFERED": "1",
        })
        opt = str(self.opt_dir) if self.opt_dir else str(self.task_root / ".no-opt")
        site = f"{opt}/python/lib/python{self.python_version}/site-packages"
        if self.image:
            env["PYTHONPATH"] = f"{site}:{opt}/python"
        else:
            env.update({
                "_HANDLER": self.handler,
                "LAMBDA_RUNTIME_PYTHON": str(self.python),
                "LAMBDA_OPT_DIR": opt,
                # What the managed runtime sets; awslambdaric keys its JSON encoding and polling off it.
                "AWS_EXECUTION_ENV": f"AWS_Lambda_python{self.python_version}",
            })
            if self.wrapper:
                env["AWS_LAMBDA_EXEC_WRAPPER"] = f"{opt}/{WRAPPER_NAME}"
        env.update(self.extra_env)
        env["AWS_LAMBDA_RUNTIME_API"] = f"127.0.0.1:{api_port}"  # RIE sets it too; keep ours consistent
        return env

    def command(self, api_port: int) -> list[str]:
        rie = [str(downloads.rie()), "--runtime-interface-emulator-address", f"127.0.0.1:{self.port}",
               # Its default (127.0.0.1:9001) would clash between environments running side by side.
               "--runtime-api-address", f"127.0.0.1:{api_port}"]
        if not self.image:
            return [*rie, str(RUNTIME_DIR / "bootstrap")]
        wrapper = [f"{self.opt_dir}/{WRAPPER_NAME}"] if self.wrapper else []
        return [*rie, *wrapper, str(self.python), "-m", "awslambdaric", self.handler]

    def start(self) -> LambdaEnvironment:
        """Start RIE and wait until it accepts connections (the runtime starts on the first invoke)."""
        last: Exception | None = None
        for _ in range(3):  # a free port can be taken between choosing and binding it: choose again
            self.port, api_port = free_port(), free_port()
            with open(self.log_path, "ab") as log:
                log.write(f"--- starting RIE on {self.port} (runtime API {api_port})\n".encode())
                log.flush()
                self.process = subprocess.Popen(
                    self.command(api_port), cwd=self.task_root, env=self.environment(api_port),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: stop() kills RIE and the runtime together
                )
            try:
                wait_for(self._accepts, START_TIMEOUT, f"RIE on port {self.port}")
                return self
            except RuntimeError as error:  # exited early
                last = error
                self.stop()
        raise RuntimeError(f"RIE would not start: {last}\n{self.logs()[-3000:]}")

    def _accepts(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"RIE exited with {self.process.returncode if self.process else None}")
        try:
            with contextlib.closing(http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)) as conn:
                conn.connect()
            return True
        except OSError:
            return False

    def invoke(self, event: bytes | str | Any, timeout: float | None = None) -> Invocation:
        """POST one event (bytes as they are, anything else as JSON) and return RIE's answer."""
        if self.process is None:
            raise RuntimeError("the environment is not started")
        body = event if isinstance(event, bytes) else json.dumps(event).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout or self.timeout + 30)
        try:
            conn.request("POST", INVOKE_PATH, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return Invocation(response.status, response.read(), dict(response.getheaders()))
        finally:
            conn.close()

    def logs(self) -> str:
        """Everything RIE and the runtime wrote (RIE forwards the runtime's stdout and stderr)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """Stop RIE and every process it started; kill what lingers. Safe to call twice.

        RIE puts the runtime in a process group of its own, so killing RIE's group is not enough; all of
        them share the session that `start_new_session` made, whose id is RIE's PID.
        """
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()  # RIE's own shutdown SIGKILLs the runtime
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        deadline = time.monotonic() + 10
        while members := _session_members(process.pid):
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {members} of RIE session {process.pid} would not die")
            time.sleep(0.02)

    def __enter__(self) -> LambdaEnvironment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
