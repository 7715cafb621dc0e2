"""AWS's DynamoDB Local, run with Java on a free loopback port for the tests, the demo and the benchmark."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from . import downloads

START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
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
    def __init__(self, log_path: Path | None = None) -> None:
        self.home = downloads.dynamodb_local()
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> DynamoDBLocal:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it)
        self.process = subprocess.Popen(
            ["java", f"-Djava.library.path={self.home / 'DynamoDBLocal_lib'}", "-jar",
             str(self.home / "DynamoDBLocal.jar"), "-inMemory", "-port", str(self.port)],
            cwd=self.home, stdout=log, stderr=subprocess.STDOUT,
        )
        wait_for(self._answers, START_TIMEOUT, f"DynamoDB Local on port {self.port}")
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"DynamoDB Local exited with {self.process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: DynamoDB_20120810.ListTables\r\n"
                             b"Content-Type: application/x-amz-json-1.0\r\nContent-Length: 2\r\n\r\n{}")
                return sock.recv(12).startswith(b"HTTP/1.1")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def create_table(
    client: Any, name: str, *, key_attr: str = "id", sort_key_attr: str | None = None,
    ttl_attr: str = "expires_at",
) -> str:
    """An on-demand table with TTL on `ttl_attr`, like the SAM template's."""
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
