"""The durable soak (`./build.sh chaos --durable`, `python -m tools.durable_soak`): durable executions fed twice.

AWS's durable execution local runner (`dex-local-runner start-server`, with Lambda-shaped execution ARNs:
tests/support/durable.py) starts executions of `tests/e2e/apps/durable_orders.py`, a workflow written with AWS's
durable execution SDK (a charge in a step, a wait, the receipt as its result), and invokes them, first and after
each wait, through a stand-in for Lambda's front end: each invocation goes to an idle execution environment (the
Runtime Interface Emulator and awslambdaric, the built layer attached with AWS_LAMBDA_EXEC_WRAPPER and
IDEMPOTENCY_DURABLE=execution), one invocation at a time each, on DynamoDB Local behind the fault proxy. A share
of the invocations have their environment SIGKILLed mid-invocation (before, during or after the step's charge);
the front end answers them as Lambda does a crashed runtime (`Runtime.ExitError`, a function error), the runner
invokes the execution again after its back-off, and a fresh environment takes the dead one's place.

Each order is delivered once or, for a share, two or three times, the copies starting new executions with the
same SQS-shaped input at random moments (while the first runs, while it waits, after it ended), as an event
source mapping starts a new execution for each delivery. A delivery whose execution fails as in progress
(`IdempotencyAlreadyInProgressError`) is delivered again a little later, as the queue would, within a budget.

The verdict comes from the workflow's own side effects (a ledger line per charge: the order and the execution)
and from what the runner says each execution ended with, never from the layer's logs:

- doubles: orders charged by more than one execution (a workflow run twice);
- lost: deliveries that never ended SUCCEEDED within their budget;
- divergent: SUCCEEDED results that are not the order's receipt;
- unexpected: executions that ended any other way (another error type, timed out, stopped);
- stuck: records still in progress at the end, every execution over.
A step that ran again within its own execution after a kill (the SDK's steps are at-least-once) is counted apart,
as `step_reruns`: the layer does not make one execution's steps exactly-once, and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3

from tests.support.durable import LocalRunner, function_package, sqs_input
from tests.support.dynamodb_local import DynamoDBLocal, create_table
from tests.support.fault_proxy import FaultProxy, even_mix
from tests.support.rie import LambdaEnvironment, ensure_layer, unpack_layer
from tools.runtime import runtime_python, terminated

FUNCTION = "function"  # the one name the emulator serves
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "soak", "AWS_SECRET_ACCESS_KEY": "soak", "AWS_REGION": "us-east-1",
               "AWS_DEFAULT_REGION": "us-east-1"}
IN_PROGRESS = "idempotency_layer.errors.IdempotencyAlreadyInProgressError"
EXIT_ERROR = b'{"errorType": "Runtime.ExitError", "errorMessage": "the execution environment was killed"}'


@dataclass(frozen=True)
class Settings:
    orders: int = 200
    duplicates: float = 0.5  # fraction of orders delivered two or three times
    kill_rate: float = 0.05  # fraction of invocations whose environment is SIGKILLed mid-invocation
    kill_window_s: float = 0.3  # a kill lands within this long of the invocation's start
    step_work_ms: int = 80  # the step's work after its charge: the window in which a kill makes the step run again
    fault_rate: float = 0.02  # fraction of store requests faulted, every kind alike
    environments: int = 4
    seed: int = 1
    wait_s: int = 1  # the workflow's wait
    spread_s: float = 5.0  # a duplicate starts within this long of its order's first delivery
    rate: float = 8.0  # orders' first deliveries per second
    lease_s: int = 300  # IDEMPOTENCY_IN_PROGRESS_SECONDS: the executions' timeout is 120 s
    attempts: int = 60  # deliveries of one copy refused as in progress before it counts as lost
    python: str | None = None
    mode: str = "execution"  # IDEMPOTENCY_DURABLE: `pass` shows what the verdict finds without the layer's claims

    def check(self) -> None:
        for name in ("duplicates", "kill_rate", "fault_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} is a fraction between 0 and 1, not {getattr(self, name)}")
        if self.mode not in ("execution", "pass"):
            raise ValueError(f"mode is execution or pass, not {self.mode!r}")
        if self.orders < 1 or self.environments < 1 or self.attempts < 1:
            raise ValueError("orders, environments and attempts must be at least 1")


class Front:
    """Lambda's front end as the runner sees it: an invoke goes to an idle environment, one invocation at a time
    each; a share of them are SIGKILLed mid-invocation, answered `Runtime.ExitError` and replaced."""

    def __init__(self, make_env: Callable[[], LambdaEnvironment], settings: Settings, rng: random.Random) -> None:
        self.make_env = make_env
        self.settings = settings
        self.rng = rng
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.idle: queue.Queue[LambdaEnvironment] = queue.Queue()
        self.envs: list[LambdaEnvironment] = []
        for _ in range(settings.environments):
            self._add()
        front = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, headers, answer = front.invoke(body)
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(answer))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _add(self) -> None:
        env = self.make_env()
        with self.lock:
            self.envs.append(env)
        self.idle.put(env)

    def invoke(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        env = self.idle.get(timeout=120)
        with self.lock:
            self.counts["invocations"] += 1
            delay = self.rng.uniform(0, self.settings.kill_window_s) if self.rng.random() < self.settings.kill_rate \
                else None
        state = {"fired": False, "cancelled": False}

        def kill() -> None:
            with self.lock:
                if state["cancelled"]:
                    return
                state["fired"] = True
            env.stop()  # the emulator and the runtime, SIGKILLed as one

        timer = threading.Timer(delay, kill) if delay is not None else None
        if timer is not None:
            timer.start()
        try:
            answer = env.invoke(body, timeout=90)
        except Exception:
            answer = None
        if timer is not None:
            with self.lock:
                state["cancelled"] = not state["fired"]
                if state["cancelled"]:
                    self.counts["kills_too_late"] += 1  # the invocation ended before the kill's moment
            timer.join()
        if state["fired"] or answer is None:
            with self.lock:
                self.counts["kills" if state["fired"] else "lost_environments"] += 1
                self.envs.remove(env)
            env.stop()
            self._add()
            return 200, {"X-Amz-Function-Error": "Unhandled", "Content-Type": "application/json"}, EXIT_ERROR
        self.idle.put(env)
        headers = {"Content-Type": "application/json"}
        with contextlib.suppress(ValueError):
            parsed = json.loads(answer.body)
            if isinstance(parsed, dict) and "errorType" in parsed and "Status" not in parsed:
                headers["X-Amz-Function-Error"] = "Unhandled"  # as Lambda marks a handler's raise
                with self.lock:
                    self.counts["function_errors"] += 1
        return answer.status, headers, answer.body

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            envs, self.envs = list(self.envs), []
        for env in envs:
            env.stop()


class Deliveries:
    """The orders' deliveries, each started as a new execution and delivered again while it is refused as in
    progress; what each ended with."""

    def __init__(self, runner: LocalRunner, settings: Settings, rng: random.Random) -> None:
        self.runner = runner
        self.settings = settings
        self.lock = threading.Lock()
        self.ends: Counter[str] = Counter()
        self.results: dict[str, list[str | None]] = {}
        self.lost: list[str] = []
        self.plan: list[tuple[float, str]] = []
        for i in range(settings.orders):
            order = f"order-{settings.seed}-{i}"
            first = i / settings.rate
            copies = 1 if rng.random() >= settings.duplicates else rng.choice((2, 3))
            self.plan.append((first, order))
            self.plan += [(first + rng.uniform(0, settings.spread_s), order) for _ in range(copies - 1)]
        self.plan.sort()
        self.rng = random.Random(rng.random())

    def run(self) -> None:
        started = time.monotonic()
        threads = []
        for at, order in self.plan:
            time.sleep(max(0.0, started + at - time.monotonic()))
            thread = threading.Thread(target=self._deliver, args=(order, random.Random(self.rng.random())))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()

    def _deliver(self, order: str, rng: random.Random) -> None:
        for _ in range(self.settings.attempts):
            try:
                arn = self.runner.start_execution(FUNCTION, sqs_input(order))
                ended = self.runner.wait(arn, timeout=180)
            except Exception as error:  # the runner itself: counted, and the delivery comes again
                self._end(f"runner_error:{type(error).__name__}")
                time.sleep(1)
                continue
            error_type = (ended.get("Error") or {}).get("ErrorType")
            if ended["Status"] == "SUCCEEDED":
                self._end("succeeded")
                with self.lock:
                    self.results.setdefault(order, []).append(ended.get("Result"))
                return
            if ended["Status"] == "FAILED" and error_type == IN_PROGRESS:
                self._end("in_progress")
                time.sleep(rng.uniform(0.5, 2.0))  # the queue delivers it again after its visibility timeout
                continue
            self._end(f"unexpected:{ended['Status']}:{error_type}")
            return
        with self.lock:
            self.lost.append(order)

    def _end(self, what: str) -> None:
        with self.lock:
            self.ends[what] += 1


def verdict(settings: Settings, ledger: Path, deliveries: Deliveries, records: list[dict[str, Any]]
            ) -> dict[str, Any]:
    """The figures, from the ledger and what each execution ended with."""
    charges: dict[str, list[str]] = {}
    for line in ledger.read_text().splitlines():
        order, execution = line.split()
        charges.setdefault(order, []).append(execution)
    doubles = sorted(order for order, runs in charges.items() if len(set(runs)) > 1)
    step_reruns = sum(len(runs) - len(set(runs)) for runs in charges.values())
    divergent = sorted(order for order, results in deliveries.results.items()
                       if any(json.loads(r or "null") != {"receipt": f"charged {order}"} for r in results))
    uncharged = sorted(set(deliveries.results) - set(charges))
    unexpected = {k: v for k, v in deliveries.ends.items() if not k.startswith(("succeeded", "in_progress"))}
    stuck = sum(item["status"]["S"] != "COMPLETED" for item in records)
    return {
        "orders": settings.orders, "deliveries": len(deliveries.plan),
        "duplicated_orders": sum(n > 1 for n in Counter(order for _, order in deliveries.plan).values()),
        "ends": dict(deliveries.ends), "charges": sum(map(len, charges.values())),
        "doubles": len(doubles), "double_orders": doubles[:20], "step_reruns": step_reruns,
        "lost": len(deliveries.lost), "divergent": len(divergent) + len(uncharged), "unexpected": sum(
            unexpected.values()), "stuck": stuck, "records": len(records),
    }


def soak(settings: Settings, *, work: Path, dynamodb_endpoint: str, opt_dir: Path,
         say: Callable[[str], None] = print) -> dict[str, Any]:
    """One soak: the report (settings, figures, whether it passed)."""
    settings.check()
    rng = random.Random(settings.seed)
    work.mkdir(parents=True, exist_ok=True)
    version, python = runtime_python(settings.python)
    client = boto3.client("dynamodb", endpoint_url=dynamodb_endpoint, **_boto(CREDENTIALS))
    table = create_table(client, f"durable-soak-{settings.seed}-{int(time.time())}")
    host, port = dynamodb_endpoint.rsplit("//", 1)[1].split(":")
    proxy = FaultProxy(host, int(port), even_mix(settings.fault_rate), seed=settings.seed)
    ledger = work / "ledger.txt"
    ledger.touch()
    task_root = function_package(work / "task")
    runner = LocalRunner(work / "runner.log")
    count = iter(range(10**6))
    env_settings = {**CREDENTIALS, "IDEMPOTENCY_TABLE": table, "AWS_ENDPOINT_URL_DYNAMODB": proxy.endpoint,
                    "IDEMPOTENCY_DURABLE": settings.mode, "IDEMPOTENCY_IN_PROGRESS_SECONDS": str(settings.lease_s),
                    "IDEMPOTENCY_KEY_JMESPATH": "Records[0].messageId", "IDEMPOTENCY_REQUIRE_KEY": "true",
                    "ORDERS_LEDGER": str(ledger), "ORDERS_WAIT_SECONDS": str(settings.wait_s),
                    "ORDERS_STEP_WORK_MS": str(settings.step_work_ms),
                    "AWS_ENDPOINT_URL_LAMBDA": runner.endpoint}

    def make_env() -> LambdaEnvironment:
        return LambdaEnvironment(python, task_root, version=version, handler="durable_orders.handler",
                                 env=env_settings, opt_dir=opt_dir, function_name=FUNCTION, timeout=30,
                                 log_path=work / f"env-{next(count)}.log").start()

    front = None
    started = time.monotonic()
    try:
        front = Front(make_env, settings, random.Random(rng.random()))
        runner.start(front.endpoint)
        deliveries = Deliveries(runner, settings, rng)
        say(f"durable soak: {settings.orders} orders, {len(deliveries.plan)} deliveries, "
            f"{settings.environments} environments, kill rate {settings.kill_rate}")
        deliveries.run()
        records = client.scan(TableName=table, ConsistentRead=True)["Items"]
        figures = verdict(settings, ledger, deliveries, records)
        figures.update(front=dict(front.counts), faults=proxy.faults(), store_requests=proxy.snapshot()["requests"],
                       seconds=round(time.monotonic() - started, 1))
    finally:
        runner.stop()
        if front is not None:
            front.close()
        proxy.close()
        with contextlib.suppress(Exception):
            client.delete_table(TableName=table)
    failed = [name for name in ("doubles", "lost", "divergent", "unexpected", "stuck") if figures[name]]
    if figures["records"] != settings.orders:
        failed.append("records")
    return {"settings": asdict(settings), "figures": figures, "passed": not failed, "failed": failed}


def _boto(credentials: dict[str, str]) -> dict[str, str]:
    return {"aws_access_key_id": credentials["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": credentials["AWS_SECRET_ACCESS_KEY"], "region_name": credentials["AWS_REGION"]}


def report_lines(report: dict[str, Any]) -> list[str]:
    s, f = report["settings"], report["figures"]
    return [
        f"durable soak, seed {s['seed']}: {f['orders']} orders, {f['deliveries']} deliveries "
        f"({f['duplicated_orders']} orders delivered more than once), {s['environments']} environments, "
        f"{f['seconds']} s",
        f"  front end: {f['front'].get('invocations', 0)} invocations, {f['front'].get('kills', 0)} environments "
        f"killed mid-invocation ({f['front'].get('kills_too_late', 0)} more drawn came after their invocation ended), "
        f"{f['front'].get('function_errors', 0)} function errors",
        f"  store: {f['store_requests']} requests, {f['faults']} faulted",
        "  executions ended: " + ", ".join(f"{k} {v}" for k, v in sorted(f["ends"].items())),
        f"  charges {f['charges']}, steps run again within their own execution after a kill {f['step_reruns']}",
        f"  doubles {f['doubles']}, lost {f['lost']}, divergent {f['divergent']}, unexpected {f['unexpected']}, "
        f"stuck {f['stuck']}, records {f['records']} of {f['orders']}",
        "  PASSED" if report["passed"] else "  FAILED: " + ", ".join(report["failed"]),
    ]


def _parser() -> argparse.ArgumentParser:
    d = Settings()
    p = argparse.ArgumentParser(prog="./build.sh chaos --durable", description=__doc__.split("\n\n")[0])
    for name, kind, help_ in (("orders", int, "orders, each delivered once or more"),
                              ("duplicates", float, "fraction of orders delivered two or three times"),
                              ("kill-rate", float, "fraction of invocations whose environment is killed"),
                              ("fault-rate", float, "fraction of store requests faulted"),
                              ("environments", int, "execution environments"), ("seed", int, "seeds everything"),
                              ("rate", float, "orders' first deliveries per second")):
        p.add_argument(f"--{name}", type=kind, default=getattr(d, name.replace("-", "_")),
                       help=f"{help_} (default: %(default)s)")
    p.add_argument("--mode", choices=("execution", "pass"), default=d.mode,
                   help="IDEMPOTENCY_DURABLE (default: %(default)s; pass: no claims, to see the verdict find doubles)")
    p.add_argument("--python", default=None, help="the runtime's Python version (default: 3.12 when found)")
    p.add_argument("--json", type=Path, default=None, help="where to write the figures")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, terminated)
    settings = Settings(orders=args.orders, duplicates=args.duplicates, kill_rate=args.kill_rate,
                        fault_rate=args.fault_rate, environments=args.environments, seed=args.seed, rate=args.rate,
                        python=args.python, mode=args.mode)
    try:
        settings.check()
    except ValueError as error:
        print(f"durable soak: {error}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="idempotency-durable-soak-"))
    ddb = DynamoDBLocal(work / "dynamodb.log")
    try:
        opt_dir = unpack_layer(ensure_layer(), work / "opt")
        ddb.start()
        report = soak(settings, work=work / "soak", dynamodb_endpoint=ddb.endpoint, opt_dir=opt_dir,
                      say=lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        ddb.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(report_lines(report)), flush=True)
    report["command"] = ["./build.sh", "chaos", "--durable", *(argv if argv is not None else sys.argv[1:])]
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
