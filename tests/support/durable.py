"""AWS's durable execution SDK and its local runner with the layer.

The runner names executions with opaque local ids (`<uuid>/<invocation id>`), not Lambda ARNs, so the layer would
take its envelopes for another event. `lambda_shaped_arns` gives every execution the runner starts an ARN as Lambda
names one (`arn:aws:lambda:<region>:<account>:function:<name>:$LATEST/durable-execution/<execution>/<id>`), keeping
the last segment, which the SDK reads back as the EXECUTION operation's id. The layer's recognition of ARNs is not
touched. `python -m tests.support.durable start-server ...` is `dex-local-runner` with that change.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any


def lambda_arn(region: str, account: str, function: str, execution: str, last: str) -> str:
    return f"arn:aws:lambda:{region}:{account}:function:{function}:$LATEST/durable-execution/{execution}/{last}"


def _patch(region: str) -> Callable[[], None]:
    from aws_durable_execution_sdk_python_testing.execution import Execution

    original = Execution.__dict__["new"]

    def new(input: Any) -> Any:
        start = input
        made = original.__func__(start)
        last = made.durable_execution_arn.rsplit("/", 1)[-1]
        made.durable_execution_arn = lambda_arn(region, start.account_id, start.function_name.split(":")[0],
                                                uuid.uuid4().hex, last)
        return made

    Execution.new = staticmethod(new)
    return lambda: setattr(Execution, "new", original)


@contextlib.contextmanager
def lambda_shaped_arns(region: str) -> Iterator[None]:
    undo = _patch(region)
    try:
        yield
    finally:
        undo()


def function_package(root: Any) -> Any:
    """A durable function's package as a user deploys it, in the folder `root` (a Path, made here): the workflow
    (tests/e2e/apps/durable_orders.py) and AWS's durable execution SDK beside it."""
    import shutil
    from pathlib import Path

    import aws_durable_execution_sdk_python as sdk

    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).resolve().parents[1] / "e2e" / "apps" / "durable_orders.py", root / "durable_orders.py")
    shutil.copytree(Path(sdk.__file__).parent, root / "aws_durable_execution_sdk_python",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


class Envelope(dict):
    """The envelope the in-process runner hands a handler (an SDK object carrying its in-memory service client),
    as the JSON object Lambda delivers, for the layer; `invocation` keeps the object for the SDK's handler."""

    invocation: Any = None


def in_process(layer_handler: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """The layer's assembled handler as DurableFunctionTestRunner calls a handler."""
    def call(invocation: Any, context: Any) -> Any:
        envelope = Envelope(json.loads(json.dumps(invocation.to_json_dict())))
        envelope.invocation = invocation
        return layer_handler(envelope, context)
    return call


def unwrap(workflow: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """The user's durable handler as the layer calls it in process: given the SDK's object back."""
    return lambda event, context: workflow(getattr(event, "invocation", None) or event, context)


def sqs_input(order: str) -> str:
    """An SQS event source mapping's batch of one message, as a durable execution's input (JSON text)."""
    return json.dumps({"Records": [{
        "messageId": str(uuid.uuid5(uuid.NAMESPACE_URL, order)), "receiptHandle": "handle",
        "body": json.dumps({"orderId": order}), "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders", "awsRegion": "us-east-1"}]})


def main() -> int:
    from aws_durable_execution_sdk_python_testing import cli

    _patch(os.environ.get("AWS_DEX_LOCAL_RUNNER_REGION") or os.environ.get("AWS_REGION") or "us-east-1")
    return cli.main()


if __name__ == "__main__":
    raise SystemExit(main())


class LocalRunner:
    """`dex-local-runner start-server` (AWS's stand-in for the durable execution service), with Lambda-shaped
    execution ARNs, on a loopback port chosen when it is made (so a function's settings can name `endpoint` before
    it starts), invoking functions at the endpoint `start` is given (the emulator's). Started and stopped by its
    process group; `start_execution` and `wait` speak its HTTP API."""

    def __init__(self, log_path: Any, region: str = "us-east-1") -> None:
        from .dynamodb_local import free_port

        self.log_path = log_path
        self.region = region
        self.port = free_port()
        self.process: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, lambda_endpoint: str) -> LocalRunner:
        import subprocess
        import sys
        from pathlib import Path

        from .dynamodb_local import wait_for

        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
               "AWS_REGION": self.region, "AWS_DEFAULT_REGION": self.region, "PYTHONPATH": str(root)}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.durable", "start-server", "--host", "127.0.0.1",
                 "--port", str(self.port), "--lambda-endpoint", lambda_endpoint,
                 "--local-runner-endpoint", self.endpoint, "--local-runner-region", self.region,
                 "--execution-timeout", "120", "--invocation-timeout", "60", "--log-level", "INFO"],
                cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        wait_for(self._accepts, 30, f"the durable local runner on port {self.port}")
        return self

    def _accepts(self) -> bool:
        import socket

        if self.process.poll() is not None:
            raise RuntimeError(f"the local runner exited with {self.process.returncode}: {self.logs()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return True
        return False

    def logs(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as log:
                return log.read()
        except FileNotFoundError:
            return ""

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            text = response.read().decode()
            if response.status >= 300:
                raise RuntimeError(f"{method} {path}: {response.status} {text[:500]}")
            return json.loads(text) if text else None
        finally:
            conn.close()

    def start_execution(self, function: str, payload: str, name: str | None = None) -> str:
        """Start an execution of `function` with `payload` (its input, JSON text), as a caller's Invoke of a
        durable function (or an event source mapping's) does: its ARN."""
        answer = self._call("POST", "/start-durable-execution", {
            "AccountId": "123456789012", "FunctionName": function, "FunctionQualifier": "$LATEST",
            "ExecutionName": name or f"run-{uuid.uuid4().hex[:12]}", "ExecutionTimeoutSeconds": 120,
            "ExecutionRetentionPeriodDays": 1, "InvocationId": str(uuid.uuid4()), "Input": payload})
        return answer["ExecutionArn"] if "ExecutionArn" in answer else answer["DurableExecutionArn"]

    def execution(self, arn: str) -> dict[str, Any]:
        from urllib.parse import quote

        return self._call("GET", f"/2025-12-01/durable-executions/{quote(arn, safe='')}")

    def wait(self, arn: str, timeout: float = 60) -> dict[str, Any]:
        """The execution once it has ended (SUCCEEDED, FAILED, TIMED_OUT, STOPPED)."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            found = self.execution(arn)
            if found["Status"] != "RUNNING":
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"execution {arn} still running after {timeout} s")
            time.sleep(0.1)

    def stop(self) -> None:
        import signal
        import subprocess

        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

