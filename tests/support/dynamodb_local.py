"""AWS's DynamoDB Local, run with Java on a free loopback port for the tests, the demo and the benchmark."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from . import downloads

START_TIMEOUT = 60.0
_T = TypeVar("_T")


def free_port() -> int:
    """A port nothing listens on now (the caller binds it soon after; a clash shows as a failed start)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition: Callable[[], _T], timeout: float, what: str, interval: float = 0.05) -> _T:
    """Poll `condition` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class DynamoDBLocal:
    """One DynamoDB Local process; `stop()` then `start()` brings it back on the same port (empty)."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.home = downloads.dynamodb_local()
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.tmpdir: str | None = None

    def start(self) -> DynamoDBLocal:
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java is missing: apt-get install -y openjdk-17-jre-headless (./build.sh test does)")
        # The JVM copies sqlite4java's native library into java.io.tmpdir at every start: keep it in our own
        # folder, removed at stop, so runs leave nothing in /tmp.
        self.tmpdir = tempfile.mkdtemp(prefix="dynamodb-local-")
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 (closed below)
        try:
            # DynamoDB Local has no bind-address option (it listens on every interface); everything here talks
            # to it on 127.0.0.1 only. -disableTelemetry: it would otherwise phone home. -sharedDb: one
            # database whatever the credentials and region, so every client sees the same tables.
            self.process = subprocess.Popen(
                [java, "-XX:-UsePerfData", f"-Djava.library.path={self.home / 'DynamoDBLocal_lib'}",
                 f"-Djava.io.tmpdir={self.tmpdir}", "-jar",
                 str(self.home / "DynamoDBLocal.jar"), "-inMemory", "-sharedDb", "-disableTelemetry",
                 "-port", str(self.port)],
                cwd=self.home, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # the child holds its own copy
        try:
            wait_for(self._answers, START_TIMEOUT, f"DynamoDB Local on port {self.port}")
        except BaseException:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path else ""
            raise RuntimeError(f"DynamoDB Local exited with {self.process.returncode} (port {self.port}):\n{log}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: DynamoDB_20120810.ListTables\r\n"
                             b"Content-Type: application/x-amz-json-1.0\r\nContent-Length: 2\r\n\r\n{}")
                return sock.recv(12).startswith(b"HTTP/1.1")
        except OSError:
            return False

    def stop(self) -> None:
        """Terminate by PID; kill if it does not exit within 10 s. Safe to call twice."""
        process, self.process = self.process, None
        try:
            if process is not None:
                self._stop(process)
        finally:
            if self.tmpdir:
                shutil.rmtree(self.tmpdir, ignore_errors=True)
                self.tmpdir = None

    @staticmethod
    def _stop(process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def create_table(
    client: Any, name: str, *, key_attr: str = "id", sort_key_attr: str | None = None,
    ttl_attr: str = "expires_at",
) -> str:
    """An on-demand table with TTL on `ttl_attr`, like the SAM template's; returns once it is ACTIVE."""
    keys = [{"AttributeName": key_attr, "KeyType": "HASH"}]
    attributes = [{"AttributeName": key_attr, "AttributeType": "S"}]
    if sort_key_attr:
        keys.append({"AttributeName": sort_key_attr, "KeyType": "RANGE"})
        attributes.append({"AttributeName": sort_key_attr, "AttributeType": "S"})
    client.create_table(TableName=name, KeySchema=keys, AttributeDefinitions=attributes,
                        BillingMode="PAY_PER_REQUEST")
    client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
    client.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl_attr})
    return name
