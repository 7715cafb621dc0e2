"""./build.sh demo: the unmodified examples/orders handler, examples/shipments SQS consumer,
examples/orders_api HTTP handler and examples/kafka_orders Kafka consumer, made exactly-once by the built
layer, locally.

DynamoDB Local holds the records; AWS's Runtime Interface Emulator runs the handler the way the managed
Python runtime does (AWS_LAMBDA_EXEC_WRAPPER=/opt/idempotency-wrapper, the layer unzipped as /opt). What
ran is counted by the handlers' own side effects: one line per placed order in ORDERS_FILE, one line per
shipped message in SHIPMENTS_FILE, one line per charged order in CHARGES_FILE.

Exits non-zero if an order was placed or shipped other than exactly once, so it doubles as a smoke test.
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import broker_events, downloads, events, http_events  # noqa: E402 (needs the repository root on the path)
from tests.support.dynamodb_local import DynamoDBLocal, create_table  # noqa: E402
from tests.support.rie import LambdaEnvironment  # noqa: E402

TABLE = "idempotency-demo"
COPIES = 5
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo", "AWS_REGION": "us-east-1"}


def unzip_layer(zip_path: Path, opt: Path) -> None:
    """Unzip as Lambda does, keeping the wrapper's mode bits (zipfile alone drops them)."""
    with zipfile.ZipFile(zip_path) as zf:
        for info in zf.infolist():
            path = Path(zf.extract(info, opt))
            if mode := (info.external_attr >> 16) & 0o777:
                path.chmod(mode)


def placed(orders_file: Path, order_id: str) -> int:
    if not orders_file.exists():
        return 0
    return sum(json.loads(line)["orderId"] == order_id for line in orders_file.read_text().splitlines())


def answer(env: LambdaEnvironment, event: dict[str, Any]) -> dict[str, Any]:
    status, body, _ = env.invoke(event)
    result = json.loads(body)
    result["_status"] = status
    return result


def show(label: str, result: dict[str, Any]) -> str:
    if "errorType" in result:
        message = result.get("errorMessage", "")
        return f"   {label}: {result['errorType']}: {message[:60]}{'...' if len(message) > 60 else ''}"
    return f"   {label}: confirmation={result['confirmation']} placedAt={result['placedAt']}"


def shipped(shipments_file: Path) -> list[str]:
    if not shipments_file.exists():
        return []
    return [json.loads(line)["orderId"] for line in shipments_file.read_text().splitlines()]


def shipments_demo(make: Any, work: Path) -> int:
    """3) The SQS consumer: a batch, a partial failure, the redeliveries; each message shipped once."""
    shipments_file, outages = work / "shipments.log", work / "outages.txt"
    env = make("shipments", {"SHIPMENTS_FILE": str(shipments_file), "OUTAGES_FILE": str(outages)})
    orders = [("S-1", "berlin"), ("S-2", "lyon"), ("S-3", "berlin"), ("S-4", "lyon"), ("S-5", "berlin")]
    queue = [events.json_message({"orderId": o, "warehouse": w, "items": [{"sku": "BOX-1", "qty": 1}]})
             for o, w in orders]
    by_id = {m.message_id: json.loads(m.body)["orderId"] for m in queue}
    arn = events.queue_arn("shipments")

    def deliver(label: str, messages: list[events.Message]) -> list[str]:
        status, body, _ = env.invoke(events.sqs_event(messages, arn))
        value = json.loads(body)
        if status != 200 or (isinstance(value, dict) and "errorType" in value):
            print(f"   {label}: ERROR {value.get('errorType')}")
            return [m.message_id for m in messages]
        failed = [item["itemIdentifier"] for item in (value or {}).get("batchItemFailures", [])]
        names = ", ".join(by_id[m] for m in failed) or "none"
        print(f"   {label}: {len(messages)} message(s) in, failures reported: {names}; shipped so far "
              f"{len(shipped(shipments_file))}")
        return failed

    print("\n3) examples/shipments (an SQS consumer, no idempotency code): each message its own record")
    outages.write_text("lyon\n")
    print("   the lyon warehouse is down")
    failed = deliver("batch of 5", queue)
    outages.unlink()
    print("   the lyon warehouse is back; the queue redelivers the failed messages")
    deliver("redelivery of the failures", [m for m in queue if m.message_id in failed])
    print("   a visibility timeout ran out under a slow consumer: the whole batch comes again, new receipt handles")
    deliver("the whole batch again", queue)
    lines = shipped(shipments_file)
    counts = {o: lines.count(o) for o, _ in orders}
    print(f"   {shipments_file.name}: {len(lines)} line(s); shipments per order: "
          + ", ".join(f"{o}={n}" for o, n in counts.items()))
    return sum(n != 1 for n in counts.values()) + (len(failed) != 2)


def kafka_demo(make: Any, work: Path) -> int:
    """5) The Kafka consumer: a batch across two partitions with a failure, Lambda resuming the failed partition
    at the reported offset, a rebalance redelivering everything, a producer's duplicate; each order charged once."""
    charges_file, outages = work / "charges.log", work / "kafka-outages.txt"
    env = make("kafka_orders", {"CHARGES_FILE": str(charges_file), "OUTAGES_FILE": str(outages),
                                "IDEMPOTENCY_KEY_JMESPATH": "powertools_json(powertools_base64(value)).orderId"})
    placed = [(0, 15, "K-1", "EUR"), (0, 16, "K-2", "USD"), (0, 17, "K-3", "EUR"), (1, 7, "K-4", "EUR"),
              (1, 8, "K-5", "USD"), (0, 18, "K-1", "EUR")]  # the last: the producer's retry of K-1, a later offset
    records = [broker_events.kafka_record("orders", p, off, {"orderId": o, "currency": c, "amount": 100}, key=o)
               for p, off, o, c in placed]

    def deliver(label: str, batch: list[dict[str, Any]]) -> list[str]:
        status, body, _ = env.invoke(broker_events.kafka_event(batch))
        value = json.loads(body)
        if status != 200 or (isinstance(value, dict) and "errorType" in value):
            print(f"   {label}: ERROR {value.get('errorType')}")
            return ["error"]
        stops = [f"{i['itemIdentifier']['partition']}@{i['itemIdentifier']['offset']}"
                 for i in (value or {}).get("batchItemFailures", [])]
        print(f"   {label}: {len(batch)} record(s) in, partitions stopped: {', '.join(stops) or 'none'}; charged so "
              f"far {len(charged(charges_file))}")
        return stops

    print("\n5) examples/kafka_orders (a Kafka consumer, no idempotency code): each order charged once")
    outages.write_text("USD\n")
    print("   USD payments are down")
    stops = deliver("batch from orders-0 and orders-1", records[:5])
    outages.unlink()
    print("   USD payments are back; Lambda resumes each stopped partition at its reported offset")
    deliver("orders-0 from 16 (with the producer's second K-1), orders-1 from 8",
            [records[1], records[2], records[5], records[4]])
    print("   a rebalance: the new consumer starts from older commits, everything comes again")
    deliver("every record again", records)
    lines = charged(charges_file)
    counts = {o: lines.count(o) for o in ("K-1", "K-2", "K-3", "K-4", "K-5")}
    print(f"   {charges_file.name}: {len(lines)} line(s); charges per order: "
          + ", ".join(f"{o}={n}" for o, n in counts.items()))
    return sum(n != 1 for n in counts.values()) + (stops != ["orders-0@16", "orders-1@8"])


def charged(charges_file: Path) -> list[str]:
    if not charges_file.exists():
        return []
    return [json.loads(line)["orderId"] for line in charges_file.read_text().splitlines()]


def http_demo(make: Any, work: Path) -> int:
    """4) The HTTP handler behind an HTTP API: a retry replayed and marked, a concurrent duplicate answered 409
    (or, waiting, with the replay), a reused key with another body answered 422; each order placed once."""
    orders_file = work / "api-orders.log"
    settings = {"ORDERS_FILE": str(orders_file), "PLACE_ORDER_SECONDS": "2"}
    first_env, busy_env = make("orders_api", settings, "a"), make("orders_api", settings, "b")
    waiting_env = make("orders_api", {**settings, "IDEMPOTENCY_WAIT_SECONDS": "5"}, "c")
    body = json.dumps({"items": [{"sku": "LAMP-3", "quantity": 1}]})

    def post(env: LambdaEnvironment, key: str, text: str = body) -> dict[str, Any]:
        headers = {"content-type": "application/json", "idempotency-key": f'"{key}"'}
        return json.loads(env.invoke(http_events.v2("POST", "/orders", headers, text, route="POST /orders")).body)

    def show_http(label: str, response: dict[str, Any]) -> None:
        headers = {k.lower(): v for k, v in (response.get("headers") or {}).items()}
        extra = [f"{name}: {headers[name]}" for name in ("idempotent-replayed", "retry-after") if name in headers]
        detail = json.loads(response["body"]).get("orderId") or json.loads(response["body"]).get("title")
        print(f"   {label}: {response['statusCode']} {detail}{'; ' + ', '.join(extra) if extra else ''}")

    def in_background(env: LambdaEnvironment, key: str) -> tuple[threading.Thread, dict[str, Any]]:
        box: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: box.update(r=post(env, key)))
        thread.start()
        return thread, box

    print("\n4) examples/orders_api (an HTTP API handler, no idempotency code) with Idempotency-Key")
    for env in (first_env, busy_env, waiting_env):
        post(env, f"warm-up-{id(env)}")
    placed_before = len(orders_file.read_text().splitlines())
    first = post(first_env, "key-1")
    show_http("POST key-1", first)
    retry = post(first_env, "key-1")
    show_http("POST key-1 again (the client's retry)", retry)
    thread, _ = in_background(first_env, "key-2")
    time.sleep(0.5)  # the first is inside its 2 s order placement now
    busy = post(busy_env, "key-2")
    show_http("POST key-2 while its first request runs", busy)
    thread.join()
    thread, box3 = in_background(first_env, "key-3")
    time.sleep(0.5)  # the first is inside its 2 s order placement now
    waited = post(waiting_env, "key-3")
    show_http("POST key-3 while its first runs, IDEMPOTENCY_WAIT_SECONDS=5", waited)
    thread.join()
    mismatch = post(first_env, "key-1", json.dumps({"items": [{"sku": "SOFA-9", "quantity": 2}]}))
    show_http("POST key-1 with another order", mismatch)
    placed = len(orders_file.read_text().splitlines()) - placed_before
    print(f"   {orders_file.name}: {placed} order(s) placed for 3 keys")
    ok = (first["statusCode"] == 201 and retry["body"] == first["body"]
          and retry["headers"].get("Idempotent-Replayed") == "true" and busy["statusCode"] == 409
          and waited["body"] == box3["r"]["body"] and mismatch["statusCode"] == 422 and placed == 3)
    return 0 if ok else 1


def main() -> int:
    arch = "arm64" if platform.machine() in ("aarch64", "arm64") else "x86_64"
    zip_path = ROOT / "dist" / f"idempotency-layer-{arch}.zip"
    if not zip_path.exists():
        print(f"{zip_path} is missing: run ./build.sh first", file=sys.stderr)
        return 1
    runtimes = downloads.runtimes()
    version = "3.12" if "3.12" in runtimes else max(runtimes, key=lambda v: tuple(map(int, v.split("."))))
    work = Path(tempfile.mkdtemp(prefix="idempotency-demo-"))
    task_root, opt, orders_file = work / "task", work / "opt", work / "orders.log"
    shutil.copytree(ROOT / "examples" / "orders", task_root, ignore=shutil.ignore_patterns("__pycache__"))
    for example in ("shipments", "orders_api", "kafka_orders"):
        shutil.copytree(ROOT / "examples" / example, work / example, ignore=shutil.ignore_patterns("__pycache__"))
    unzip_layer(zip_path, opt)

    failures = 0
    ddb = DynamoDBLocal(work / "dynamodb.log").start()
    environments: list[LambdaEnvironment] = []
    try:
        client = boto3.client(
            "dynamodb",
            endpoint_url=ddb.endpoint,
            region_name=CREDENTIALS["AWS_REGION"],
            aws_access_key_id="demo",
            aws_secret_access_key="demo",
        )
        create_table(client, TABLE)
        function_env = {
            **CREDENTIALS,
            "AWS_ENDPOINT_URL_DYNAMODB": ddb.endpoint,
            "IDEMPOTENCY_TABLE": TABLE,
            "IDEMPOTENCY_KEY_JMESPATH": "orderId",
            "ORDERS_FILE": str(orders_file),
        }

        def environment(i: int) -> LambdaEnvironment:
            env = LambdaEnvironment(
                python=runtimes[version],
                task_root=task_root,
                opt_dir=opt,
                log_path=work / f"rie-{i}.log",
                env=function_env,
                function_name="orders-demo",
            )
            environments.append(env)
            return env.start()

        print(f"layer {zip_path.relative_to(ROOT)} on Python {version} (managed runtime via the emulator)")
        print(f"DynamoDB Local {ddb.endpoint}, table {TABLE}; orders file {orders_file}")
        print("examples/orders/app.py has no idempotency code; AWS_LAMBDA_EXEC_WRAPPER=<opt>/idempotency-wrapper")

        # 1) A retry: the same event twice, one environment.
        event = json.loads((ROOT / "examples" / "orders" / "event.json").read_text())
        print(f"\n1) the same event twice ({event['orderId']})")
        first_env = environment(0)
        first, second = answer(first_env, event), answer(first_env, event)
        print(show("call 1", first))
        print(show("call 2", second))
        count = placed(orders_file, event["orderId"])
        same = "confirmation" in first and first == second
        print(f"   placed {count} time(s); call 2 {'replayed call 1' if same else 'DIFFERED from call 1'}")
        failures += count != 1 or not same

        # 2) A burst: five copies at once, each in its own execution environment, as Lambda scales out.
        burst = {"orderId": "order-2002", "items": [{"sku": "LAMP-3", "quantity": 1}]}
        print(f"\n2) {COPIES} copies at once ({burst['orderId']}), in {COPIES} execution environments")
        envs = [first_env, *(environment(i) for i in range(1, COPIES))]
        for i, env in enumerate(envs[1:], 1):
            answer(env, {"orderId": f"warm-up-{i}", "items": []})  # cold starts first, so the copies overlap
        gate = threading.Barrier(COPIES)
        results: list[dict[str, Any]] = [{}] * COPIES

        def fire(i: int) -> None:
            gate.wait()
            results[i] = answer(envs[i], burst)

        threads = [threading.Thread(target=fire, args=(i,)) for i in range(COPIES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, result in enumerate(results):
            print(show(f"copy {i + 1}", result))
        busy = [i for i, r in enumerate(results) if r.get("errorType") == "IdempotencyAlreadyInProgressError"]
        if busy:
            # What Lambda's own retry of those invocations would get: the stored answer, not a new order.
            print(f"   retrying the {len(busy)} told 'in progress':")
            for i in busy:
                results[i] = answer(envs[i], burst)
                print(show(f"copy {i + 1} again", results[i]))
        count = placed(orders_file, burst["orderId"])
        confirmations = {r.get("confirmation") for r in results}
        print(f"   placed {count} time(s); {COPIES} answers, {len(confirmations)} distinct confirmation(s)")
        failures += count != 1 or len(confirmations) != 1 or None in confirmations
        # Everything the handler did, straight from its side effect.
        lines = [json.loads(line)["orderId"] for line in orders_file.read_text().splitlines()]
        warmups = sum(order.startswith("warm-up-") for order in lines)
        print(f"\n{orders_file.name} (one line each time the handler placed an order): {len(lines)} line(s), "
              f"{len(set(lines))} distinct orders: the two above, placed once each, and {warmups} warm-up orders "
              "that started the burst's environments")

        def consumer(name: str, extra: dict[str, str]) -> LambdaEnvironment:
            settings = {k: v for k, v in function_env.items() if k != "IDEMPOTENCY_KEY_JMESPATH"}  # per message
            env = LambdaEnvironment(
                python=runtimes[version], task_root=work / name, opt_dir=opt, log_path=work / f"rie-{name}.log",
                env={**settings, **extra}, function_name=f"{name}-demo",
            )
            environments.append(env)
            return env.start()

        failures += shipments_demo(consumer, work)

        def api(name: str, extra: dict[str, str], index: str) -> LambdaEnvironment:
            settings = {k: v for k, v in function_env.items() if k != "IDEMPOTENCY_KEY_JMESPATH"}
            env = LambdaEnvironment(
                python=runtimes[version], task_root=work / name, opt_dir=opt,
                log_path=work / f"rie-{name}-{index}.log", env={**settings, **extra}, function_name=f"{name}-demo",
            )
            environments.append(env)
            return env.start()

        failures += http_demo(api, work)
        failures += kafka_demo(consumer, work)
        print("\ndemo: OK: every order placed once, every message shipped once, every request run once, every "
              "Kafka order charged once"
              if not failures else "demo: FAILED")
    except Exception:
        for env in environments:
            print(f"--- {env.log_path}\n{env.log_tail(3000)}", file=sys.stderr)
        raise
    finally:
        for env in environments:
            env.stop()
        ddb.stop()
    if failures:
        print(f"logs kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
