"""An SQS-compatible server for the tests: moto in server mode, on a free loopback port, stopped by its PID.

moto's SQS keeps real time: a received message stays invisible for the queue's VisibilityTimeout and then
comes back with a higher ApproximateReceiveCount, FIFO message groups stay locked while a message of theirs
is in flight, and ReceiveMessage long-polls. That is what a soak of an event source mapping needs.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from .dynamodb_local import free_port, wait_for

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


def _command() -> list[str]:
    """`moto_server` beside this interpreter (a venv's console script), else `python -m moto.server`."""
    script = Path(sys.executable).with_name("moto_server")
    if script.exists():
        return [str(script)]
    found = shutil.which("moto_server")
    return [found] if found else [sys.executable, "-m", "moto.server"]


class SQSServer:
    """One moto server process; `endpoint` is its URL. Holds every service moto has; the tests use SQS."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.log_path = log_path
        self.port = 0
        self.endpoint = ""
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> SQSServer:
        last: Exception | None = None
        for _ in range(3):  # a free port can be taken between choosing and binding it: choose again
            self.port = free_port()
            self.endpoint = f"http://127.0.0.1:{self.port}"
            log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 (closed below)
            try:
                self.process = subprocess.Popen(
                    [*_command(), "-H", "127.0.0.1", "-p", str(self.port)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env={**os.environ, "MOTO_PORT": str(self.port)},
                    start_new_session=True,  # its own process group: stop() ends it and anything it started
                )
            finally:
                if log is not subprocess.DEVNULL:
                    log.close()  # the child holds its own copy
            try:
                wait_for(self._answers, START_TIMEOUT, f"moto server on port {self.port}")
                return self
            except RuntimeError as error:  # exited early (the port was taken, say): try another port
                last = error
                self.stop()
            except BaseException:
                self.stop()
                raise
        raise RuntimeError(f"moto server would not start: {last}")

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path else ""
            raise RuntimeError(f"moto server exited with {self.process.returncode} (port {self.port}):\n{log}")
        try:
            with contextlib.closing(http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)) as conn:
                conn.request("GET", "/moto-api/")
                return conn.getresponse().status < 500
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM to its process group; SIGKILL if it has not exited within 10 s. Safe to call twice."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        else:
            process.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None
