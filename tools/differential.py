"""The differential check (issue 30): the same scenarios through two versions of the layer, every observable compared.

    python -m tools.differential --before REV [--after WORKTREE] [--only NAME]

A scenario is settings and a sequence of steps: an event sent to the assembled handler (`interceptor.build`, as
at an init, over the real store on an in-memory table with DynamoDB's semantics), or a record placed in the table
first (another invocation's live claim). Every event family runs under the settings that change a path through
the layer: whole events, HTTP requests (REST, payload 2.0, Function URLs, ALB single and multi-value), SQS
standard and FIFO, Kinesis, DynamoDB Streams, Amazon MSK and self-managed Kafka, ActiveMQ, RabbitMQ, durable
execution envelopes, malformed batches. For each step it records what the invocation answered (its value, or its
exception's type and message), the events the handler was called with, the layer's log records, the EMF documents
written, the requests made and the table's items after it: owner tokens, times and durations normalised, nothing
else. Each version runs in a process of its own (`--run LAYER_DIR`); the scenarios, built once, are fed to both.

`--before` names a git revision (checked out into a temporary worktree); `--after` defaults to this checkout.
Exit 0 when every step of every scenario is the same, else the first differences and 1.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import itertools
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TABLE = "differential"
FUNCTION = "diffn"
BASE_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_LAMBDA_FUNCTION_NAME": FUNCTION, "IDEMPOTENCY_TABLE": TABLE,
            "IDEMPOTENCY_ORIGINAL_HANDLER": "tools.differential.user_handler"}


# -- the scenarios (built once, in the parent) ------------------------------------------------------------------

def _product(**choices: list[Any]) -> list[dict[str, str]]:
    """Every combination of the settings' values; None leaves a setting unset."""
    names = list(choices)
    found = []
    for values in itertools.product(*(choices[name] for name in names)):
        found.append({name: value for name, value in zip(names, values, strict=True) if value is not None})
    return found


def _whole_scenarios() -> list[dict[str, Any]]:
    steps = [
        {"event": {"orderId": "o-1", "amount": 5, "requestedAt": 1}},
        {"event": {"orderId": "o-1", "amount": 5, "requestedAt": 2}},  # a retry: another time
        {"event": {"orderId": "o-1", "amount": 7, "requestedAt": 3}},  # the key reused with another payload
        {"event": {"amount": 9}},  # no orderId
        {"event": {"orderId": "o-2", "amount": 1, "raise": True}},  # the handler fails
        {"event": {"orderId": "o-2", "amount": 1}},  # its retry runs
        {"event": {"orderId": "o-3", "amount": 1, "status": "plain"}},
        {"claim": {"orderId": "o-4", "amount": 1}},  # another invocation holds a live claim on it
        {"event": {"orderId": "o-4", "amount": 1}},
        {"event": {"orderId": "o-5", "amount": 1, "result": "unmarshallable"}},
        {"event": "a string event"},
        {"event": [1, 2, 3]},
    ]
    return [{"name": f"whole {i}", "settings": settings, "steps": steps} for i, settings in enumerate(_product(
        IDEMPOTENCY_KEY_JMESPATH=[None, "orderId"], IDEMPOTENCY_PAYLOAD_JMESPATH=[None, "amount"],
        IDEMPOTENCY_REQUIRE_KEY=[None, "true"], IDEMPOTENCY_LOCAL_CACHE_SIZE=[None, "8"],
        IDEMPOTENCY_SCOPE=[None, "event", "record"], IDEMPOTENCY_METRICS=[None, "emf"],
        IDEMPOTENCY_LOG_LEVEL=["WARNING", "INFO"]))]


def _http_events() -> list[dict[str, Any]]:
    from tests.support import http_events

    steps: list[dict[str, Any]] = []
    for form in ("rest", "v2", "url", "alb", "alb-multi"):
        def request(key: str | None, body: dict[str, Any], cookie: str | None = None, form: str = form,
                    raw: str | None = None) -> dict[str, Any]:
            headers = {"Content-Type": "application/json"}
            if key is not None:
                headers["Idempotency-Key"] = raw if raw is not None else f'"{key}"'
            text = json.dumps(body)
            if form == "rest":
                event = http_events.rest("POST", "/orders", headers, text, principal="p-1")
            elif form in ("v2", "url"):
                event = http_events.v2("POST", "/orders", headers, text, sub="user-1", function_url=form == "url")
            else:
                event = http_events.alb("POST", "/orders", headers, text, multi=form == "alb-multi")
            if cookie is not None:
                if form in ("v2", "url"):
                    event["cookies"] = [f"session={cookie}"]
                for field in ("headers", "multiValueHeaders"):
                    if field in event:
                        event[field]["cookie"] = f"session={cookie}" if field == "headers" else [f"session={cookie}"]
            return event

        steps += [
            {"event": request(f"{form}-k1", {"orderId": "o-1"}, "alice")},
            {"event": request(f"{form}-k1", {"orderId": "o-1"}, "alice")},
            {"event": request(f"{form}-k1", {"orderId": "o-1"}, "bob")},
            {"event": request(f"{form}-k1", {"orderId": "o-2"}, "alice")},
            {"event": request(None, {"orderId": "o-3"})},
            {"event": request("x", {"orderId": "o-4"}, raw='"unterminated')},
            {"event": request(f"{form}-k5", {"orderId": "o-5", "status": 503})},
            {"event": request(f"{form}-k5", {"orderId": "o-5"})},
            {"event": request(f"{form}-k6", {"orderId": "o-6", "status": "plain"})},
            {"event": request(f"{form}-k6", {"orderId": "o-6", "status": "plain"})},
            {"event": request(f"{form}-k7", {"orderId": "o-7", "raise": True})},
        ]
    return steps


def _http_scenarios() -> list[dict[str, Any]]:
    steps = _http_events()
    return [{"name": f"http {i}", "settings": settings, "steps": steps} for i, settings in enumerate(_product(
        IDEMPOTENCY_HTTP=[None, "off"], IDEMPOTENCY_SCOPE=[None, "record"],
        IDEMPOTENCY_CALLER_HEADERS=[None, "Cookie"], IDEMPOTENCY_KEY_JMESPATH=[None, "orderId"],
        IDEMPOTENCY_REQUIRE_KEY=[None, "true"], IDEMPOTENCY_PAYLOAD_JMESPATH=[None, "body"],
        IDEMPOTENCY_METRICS=[None, "emf"], IDEMPOTENCY_LOG_LEVEL=["WARNING", "INFO"]))]


def _batch_families() -> dict[str, list[dict[str, Any]]]:
    """Each batch family's steps: a first delivery, its redelivery, one with failures reported, a record in progress
    elsewhere, a key twice, a record without its key, a malformed batch."""
    from tests.support import broker_events, events

    families: dict[str, list[dict[str, Any]]] = {}

    def sqs(fifo: bool) -> list[dict[str, Any]]:
        arn = events.queue_arn("orders", fifo=fifo)
        msgs = [events.json_message({"id": f"m{i}", "orderId": f"o-{i % 3}"}, group="g") for i in range(4)]
        failing = events.json_message({"id": "bad", "orderId": "o-9", "fail": True}, group="g")
        first = events.sqs_event(msgs, arn)
        again = events.sqs_event(msgs, arn)
        return [{"event": first}, {"event": again}, {"claim_record": [0, again]},
                {"event": events.sqs_event([events.json_message({"id": "n1", "orderId": "o-7"}, group="g"), failing,
                                            events.json_message({"id": "n2", "orderId": "o-8"}, group="g")], arn)},
                {"event": events.sqs_event([*msgs[:2], msgs[0]], arn)},
                {"event": {"Records": [{"eventSource": "aws:sqs", "body": "{}"}]}},
                {"event": {"Records": [first["Records"][0], {"eventSource": "aws:kinesis"}]}}]

    families["sqs"] = sqs(False)
    families["sqs-fifo"] = sqs(True)
    kin = [events.kinesis_record({"id": f"k{i}", "orderId": f"o-{i}", "fail": i == 2}) for i in range(4)]
    families["kinesis"] = [{"event": events.stream_event(kin[:2])}, {"event": events.stream_event(kin)},
                           {"event": events.stream_event(kin)}, {"claim_record": [3, events.stream_event(kin)]},
                           {"event": events.stream_event([kin[3], kin[0]])}]
    ddb = [events.dynamodb_record(f"d{i}") for i in range(3)]
    families["dynamodb"] = [{"event": events.stream_event(ddb)}, {"event": events.stream_event(ddb)},
                            {"event": events.stream_event([*ddb, events.dynamodb_record("d9")])}]
    kafka = [broker_events.kafka_record("orders", i % 2, 100 + i, {"id": f"r{i}", "orderId": f"o-{i}",
                                                                  "fail": i == 3}) for i in range(5)]
    for name, managed in (("msk", False), ("kafka", True)):
        families[name] = [{"event": broker_events.kafka_event(kafka[:3], self_managed=managed)},
                          {"event": broker_events.kafka_event(kafka, self_managed=managed)},
                          {"claim_record": [1, broker_events.kafka_event(kafka, self_managed=managed)]},
                          {"event": broker_events.kafka_event(kafka, self_managed=managed)},
                          {"event": {"eventSource": "aws:kafka", "records": []}}]
    active = [broker_events.activemq_message({"id": f"a{i}", "orderId": f"o-{i}"}) for i in range(3)]
    families["activemq"] = [{"event": broker_events.activemq_event(active)},
                            {"event": broker_events.activemq_event(active, redelivered=True)},
                            {"claim_record": [2, broker_events.activemq_event(active)]},
                            {"event": broker_events.activemq_event([*active, broker_events.activemq_message(
                                {"id": "a9", "orderId": "o-9"})])}]
    rabbit = {"orders::/": [broker_events.rabbitmq_message({"id": f"b{i}", "orderId": f"o-{i}"},
                                                           None if i == 1 else f"mid-{i}") for i in range(3)]}
    families["rabbitmq"] = [{"event": broker_events.rabbitmq_event(rabbit)},
                            {"event": broker_events.rabbitmq_event(rabbit, redelivered=True)}]
    return families


def _batch_scenarios() -> list[dict[str, Any]]:
    found = []
    value = "json_parse(base64_decode(value)).orderId"
    expressions = {"sqs": "json_parse(body).orderId", "sqs-fifo": "json_parse(body).orderId",
                   "kinesis": "json_parse(base64_decode(kinesis.data)).orderId", "dynamodb": "dynamodb.Keys.Id.S",
                   "msk": value, "kafka": value, "activemq": "json_parse(base64_decode(data)).orderId",
                   "rabbitmq": "json_parse(base64_decode(data)).orderId"}
    for family, steps in _batch_families().items():
        for i, settings in enumerate(_product(
                IDEMPOTENCY_STREAM_FAILURES=[None, "records"], IDEMPOTENCY_BATCH_RESPONSE=[None, "fail"],
                IDEMPOTENCY_BATCH_PRECHECK=[None, "always", "never"],
                IDEMPOTENCY_KEY_JMESPATH=[None, expressions[family]], IDEMPOTENCY_REQUIRE_KEY=[None, "true"],
                IDEMPOTENCY_LOCAL_CACHE_SIZE=[None, "8"], IDEMPOTENCY_METRICS=[None, "emf"])):
            found.append({"name": f"{family} {i}", "settings": {**settings, "IDEMPOTENCY_LOG_LEVEL": "INFO"},
                          "steps": steps})
    return found


def _durable_scenarios() -> list[dict[str, Any]]:
    envelope = {"DurableExecutionArn": f"arn:aws:lambda:us-east-1:123456789012:function:{FUNCTION}:$LATEST/"
                                       "durable-execution/order-1/6d5b2c1e", "CheckpointToken": "t-1",
                "InitialExecutionState": {"Operations": []}}
    other = copy.deepcopy(envelope)
    other["DurableExecutionArn"] = other["DurableExecutionArn"].replace(FUNCTION, "another")
    steps = [{"event": envelope}, {"event": {**envelope, "CheckpointToken": "t-2"}}, {"event": other},
             {"event": other}]
    return [{"name": f"durable {i}", "settings": settings, "steps": steps} for i, settings in enumerate(_product(
        IDEMPOTENCY_SCOPE=[None, "event", "record"], IDEMPOTENCY_METRICS=[None, "emf"],
        IDEMPOTENCY_LOG_LEVEL=["WARNING", "INFO"]))]


def _wait_and_table_scenarios() -> list[dict[str, Any]]:
    """Waiting for another invocation's claim, the claim's floor, and single-table designs (a sort key)."""
    whole = _whole_scenarios()[0]["steps"]
    found = []
    for i, settings in enumerate(_product(IDEMPOTENCY_WAIT_SECONDS=[None, "0.3"],
                                          IDEMPOTENCY_IN_PROGRESS_SECONDS=[None, "60"],
                                          IDEMPOTENCY_SORT_KEY_ATTR=[None, "sk"], IDEMPOTENCY_METRICS=[None, "emf"])):
        if "IDEMPOTENCY_SORT_KEY_ATTR" in settings:
            settings["IDEMPOTENCY_KEY_ATTR"] = "pk"
        settings.update(IDEMPOTENCY_KEY_JMESPATH="orderId", IDEMPOTENCY_LOG_LEVEL="INFO")
        found.append({"name": f"wait {i}", "settings": settings, "steps": whole})
    return found


def scenarios() -> list[dict[str, Any]]:
    return [*_whole_scenarios(), *_http_scenarios(), *_batch_scenarios(), *_durable_scenarios(),
            *_wait_and_table_scenarios()]


# -- one version: the scenarios through its layer (in a process of its own) -------------------------------------

CALLS: list[Any] = []


class _Unmarshallable:
    def __repr__(self) -> str:
        return "<unmarshallable>"


def user_handler(event: Any, context: Any) -> Any:
    """The function: records each call, then answers as the event says (a batch: failures its records ask for)."""
    CALLS.append(copy.deepcopy(event))
    if isinstance(event, dict):
        if event.get("raise"):
            raise ValueError("the handler failed")
        body = event.get("body")
        if isinstance(body, str) and body.startswith("{"):
            parsed = json.loads(body)
            if parsed.get("raise"):
                raise ValueError("the handler failed")
            status = parsed.get("status", 201)
            if status == "plain":
                return {"orderId": parsed.get("orderId"), "n": len(CALLS)}
            return {"statusCode": status, "headers": {"Content-Type": "application/json"},
                    "body": json.dumps({"orderId": parsed.get("orderId"), "n": len(CALLS)})}
        failures = _failures(event)
        if failures is not None:
            return {"batchItemFailures": failures} if failures else None
        if event.get("result") == "unmarshallable":
            return {"value": _Unmarshallable()}
    return {"ran": len(CALLS)}


def _failures(event: dict[str, Any]) -> list[Any] | None:
    """The records of a batch event that ask to fail, as its source's partial batch response names them."""
    import base64

    if isinstance(event.get("Records"), list):
        failed = []
        for record in event["Records"]:
            text = record.get("body") or (base64.b64decode(record["kinesis"]["data"]).decode()
                                          if isinstance(record.get("kinesis"), dict) else "{}")
            if json.loads(text or "{}").get("fail"):
                failed.append({"itemIdentifier": record.get("messageId")
                               or record.get("kinesis", {}).get("sequenceNumber")})
        return failed
    if isinstance(event.get("records"), dict):
        return [{"itemIdentifier": {"partition": f"{r['topic']}-{r['partition']}", "offset": r["offset"]}}
                for records in event["records"].values() for r in records
                if json.loads(base64.b64decode(r["value"])).get("fail")]
    return None


class _Context:
    aws_request_id = "00000000-0000-0000-0000-000000000001"
    function_name = FUNCTION

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelname, record.getMessage()))


class _Normaliser:
    """Owner tokens by order of appearance; times relative to the scenario's start, to 10 s; durations dropped."""

    _OWNER = re.compile(r"\b[0-9a-f]{32}\b")
    _ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
    _DURATION = re.compile(r"\d+(\.\d+)? (ms|s)\b")

    def __init__(self, start: float) -> None:
        self.start = start
        self.owners: dict[str, str] = {}

    def owner(self, token: str) -> str:
        return self.owners.setdefault(token, f"<owner {len(self.owners) + 1}>")

    def text(self, text: str) -> str:
        text = self._OWNER.sub(lambda m: self.owner(m.group(0)), text)
        text = self._ISO.sub("<time>", text)
        return self._DURATION.sub("<duration>", text)

    def item(self, item: dict[str, Any]) -> dict[str, Any]:
        found = {}
        for name, value in item.items():
            if name == "owner":
                value = {"S": self.owner(value["S"])}
            elif name == "expires_at":
                value = {"N": f"start+{round((int(value['N']) - self.start) / 10) * 10}s"}
            elif name == "in_progress_until":
                value = {"N": f"start+{round((int(value['N']) / 1000 - self.start) / 10) * 10}s"}
            found[name] = value
        return found

    def value(self, value: Any) -> Any:
        text = json.dumps(value, sort_keys=True, default=repr)
        return json.loads(self.text(text))


def _run_scenario(scenario: dict[str, Any], interceptor: Any, config_module: Any) -> list[dict[str, Any]]:
    import time

    try:
        from idempotency_layer.stores.dynamodb.store import DynamoDBStore
    except ImportError:  # a layer from before the storage floor (issue 43)
        from idempotency_layer.store import DynamoDBStore
    from tests.support.memory_dynamodb import MemoryDynamoDB, MemoryTransport

    for name in [n for n in os.environ if n.startswith("IDEMPOTENCY_")]:
        del os.environ[name]
    os.environ.update(BASE_ENV)
    os.environ.update(scenario["settings"])
    normal = _Normaliser(time.time())
    try:
        config = config_module.load()
    except Exception as error:  # settings the layer refuses at init (each version must refuse them alike)
        return [{"init": f"{type(error).__name__}: {error}"}]
    from idempotency_layer.log import setup

    setup(config.log_level)  # as at an init
    db = MemoryDynamoDB(config.attributes.key, config.attributes.sort_key, table=TABLE)
    transport = MemoryTransport(db)
    try:
        store = DynamoDBStore(transport, TABLE, config.attributes, config.partition_value,
                              key_prefix=config.key_prefix)
    except TypeError:  # a layer from before the table check read under the prefix (issue 44)
        store = DynamoDBStore(transport, TABLE, config.attributes, config.partition_value)
    out = io.StringIO()
    records = _Records()
    logger = logging.getLogger("idempotency_layer")
    logger.addHandler(records)
    try:
        with contextlib.redirect_stdout(out):
            handler = interceptor.build(config, user_handler, store=store)
        steps = []
        for step in scenario["steps"]:
            CALLS.clear()
            records.records.clear()
            out.seek(0)
            out.truncate()
            transport.requests.clear()
            done: dict[str, Any] = {}
            if "claim" in step or "claim_record" in step:
                _place_claim(step, config, store, handler)
                done["placed"] = True
            else:
                with contextlib.redirect_stdout(out):
                    try:
                        done["value"] = normal.value(handler(copy.deepcopy(step["event"]), _Context()))
                    except BaseException as error:  # the invocation's answer, as the runtime reports it
                        done["error"] = [type(error).__name__, normal.text(str(error))]
            done["calls"] = normal.value(CALLS)
            done["logs"] = [[level, normal.text(message)] for level, message in records.records]
            done["documents"] = [_document(line, normal) for line in out.getvalue().splitlines() if line.strip()]
            done["requests"] = sorted(transport.requests)  # a batch's run on threads: their order is not one
            done["items"] = {"|".join(key): normal.item(item) for key, item in sorted(db.items.items())}
            steps.append(done)
        return steps
    finally:
        logger.removeHandler(records)


def _place_claim(step: dict[str, Any], config: Any, store: Any, handler: Any) -> None:
    """Another invocation's live claim on the key of a whole event (`claim`) or of a batch's record (`claim_record`:
    the index and the batch), as the layer itself derives it."""
    import time

    from idempotency_layer.keys import KeyDeriver

    keys = KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath)
    if "claim" in step:
        key = keys.key(step["claim"])
    else:
        index, event = step["claim_record"]
        key = _record_key(config, keys, event, index)
    if key is None:
        return
    now = time.time()
    store.claim(key, "f" * 32, now, int(now * 1000) + 600_000, int(now) + 3600)


def _record_key(config: Any, keys: Any, event: Any, index: int) -> str | None:
    try:  # the layer's own functions, wherever the version keeps them
        from idempotency_layer.sources import batch

        return batch.record_key(keys, batch.parse(event, False), index)
    except Exception:
        from idempotency_layer import sources

        return sources.plan(config, keys, event).units[index].key


def _document(line: str, normal: _Normaliser) -> Any:
    try:
        doc = json.loads(line)
    except ValueError:
        return ["not json", normal.text(line)]
    doc.get("_aws", {}).pop("Timestamp", None)
    doc.pop("StoreTime", None)
    for metric in doc.get("_aws", {}).get("CloudWatchMetrics", [{}])[0].get("Metrics", []):
        if metric.get("Name") == "StoreTime":
            metric["Name"] = "<StoreTime>"
    return normal.value(doc)


class _Clock:
    """time.monotonic and time.sleep for a run: time passes only when something sleeps, so a wait polls the same
    number of times in both versions."""

    def __init__(self, start: float) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


def run_version(layer: Path, scenario_file: Path, out_file: Path) -> None:
    import random
    import time

    clock = _Clock(time.monotonic())
    time.monotonic, time.sleep = clock.monotonic, clock.sleep  # type: ignore[assignment]
    sys.path.insert(0, str(layer))
    os.environ.update(BASE_ENV)
    os.environ["IDEMPOTENCY_DISABLED"] = "true"  # the import-time init: nothing built, nothing checked
    logging.getLogger().addHandler(logging.NullHandler())  # the layer's records are captured, not printed
    from idempotency_layer import config as config_module
    from idempotency_layer import interceptor

    del os.environ["IDEMPOTENCY_DISABLED"]
    results = {}
    for scenario in json.loads(scenario_file.read_text()):
        random.seed(scenario["name"])  # the layer's jitter
        results[scenario["name"]] = _run_scenario(scenario, interceptor, config_module)
    out_file.write_text(json.dumps(results, sort_keys=True))


# -- the comparison --------------------------------------------------------------------------------------------

def compare(before: dict[str, Any], after: dict[str, Any], limit: int = 20) -> list[str]:
    differences = []
    for name in before:
        for i, (a, b) in enumerate(zip(before[name], after.get(name, []), strict=False)):
            for part in sorted(set(a) | set(b)):
                if a.get(part) != b.get(part):
                    differences.append(f"{name}, step {i}, {part}:\n  before {json.dumps(a.get(part))[:600]}\n"
                                       f"  after  {json.dumps(b.get(part))[:600]}")
        if len(before[name]) != len(after.get(name, [])):
            differences.append(f"{name}: {len(before[name])} steps before, {len(after.get(name, []))} after")
        if len(differences) >= limit:
            break
    return differences


def _worktree(revision: str, where: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "--detach", str(where), revision], cwd=ROOT, check=True,
                   capture_output=True)
    return where


def _run(layer: Path, scenario_file: Path, out_file: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{layer}{os.pathsep}{ROOT}"}
    subprocess.run([sys.executable, "-m", "tools.differential", "--run", str(layer), "--scenarios",
                    str(scenario_file), "--out", str(out_file)], cwd=ROOT, env=env, check=True)
    return json.loads(out_file.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="a git revision: the layer before the change")
    parser.add_argument("--before-layer", type=Path, help="or a layer directory (holding idempotency_layer)")
    parser.add_argument("--after-layer", type=Path, default=ROOT / "layer")
    parser.add_argument("--only", help="scenarios whose name starts with this")
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scenarios", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run is not None:
        run_version(args.run, args.scenarios, args.out)
        return 0
    with tempfile.TemporaryDirectory(prefix="idempotency-differential-") as work_dir:
        work = Path(work_dir)
        found = [s for s in scenarios() if args.only is None or s["name"].startswith(args.only)]
        scenario_file = work / "scenarios.json"
        scenario_file.write_text(json.dumps(found))
        worktree = None
        try:
            before_layer = args.before_layer
            if before_layer is None:
                worktree = _worktree(args.before or "HEAD", work / "before")
                before_layer = worktree / "layer"
            before = _run(before_layer, scenario_file, work / "before.json")
            after = _run(args.after_layer, scenario_file, work / "after.json")
        finally:
            if worktree is not None:
                subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False,
                               capture_output=True)
        steps = sum(len(s["steps"]) for s in found)
        differences = compare(before, after)
        if differences:
            print(f"{len(found)} scenarios, {steps} steps: the versions differ\n" + "\n".join(differences))
            return 1
        print(f"{len(found)} scenarios, {steps} steps: every value, error, handler call, log record, metrics "
              "document, request and table item is the same before and after")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
