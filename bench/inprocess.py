"""Steady-state invocations in-process: every system in its own worker, the same events, in lockstep.

Only one worker runs at a time (the machine has two shared cores, and DynamoDB Local and the proxy need
them too). Each batch goes to every system in turn, the order rotated per batch, so drift in the machine's
load spreads over all systems alike (`interleave`, which the floor, the A/B, the metrics' cost and the Valkey rows
run too). The counting proxy is reset before each batch and read after it, so its counts belong to that batch's
system alone.

The SQS rows invoke SQS batches (each invocation one batch of SQS_BATCH messages) on their own two workers:
an unmodified consumer under the layer, and Powertools' batch processor with idempotent_function per record.
The Kafka rows do the same with MSK batches of SQS_BATCH records over KAFKA_PARTITIONS partitions, on three
workers: the layer with IDEMPOTENCY_BATCH_PRECHECK's default (auto) and with `always`, and Powertools.
A worker that finds a record's work ran other than once stops the bench (RuntimeError).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from common import BENCH, base_env, python

from tests.support.counting_proxy import CountingProxy

MAIN = ("bare", "layer", "layer-boto3", "powertools")
CACHED = ("bare", "layer+cache", "powertools+cache")
SQS = ("layer-sqs", "powertools-sqs")
KAFKA = ("layer-kafka", "layer-kafka-always", "powertools-kafka")


@dataclass(frozen=True)
class Path_:
    name: str
    namespace: str  # key namespace: a replay path reuses its first-execution path's keys
    size: str = "small"
    keyed: bool = True
    systems: tuple[str, ...] = MAIN
    prime: bool = False  # run each event once, unmeasured, just before measuring it (cache hits)
    batch: str | None = None  # "sqs" or "kafka": each invocation is one such batch (see worker.run_batch)
    delivery: str | None = None  # a batch row's "new" or "redelivery"


PATHS = (
    Path_("first", "std"),
    Path_("replay", "std"),
    Path_("cache_hit", "cache", systems=CACHED, prime=True),
    Path_("no_key", "nokey", keyed=False),
    Path_("first_1k", "1k", "1k"),
    Path_("replay_1k", "1k", "1k"),
    Path_("first_100k", "100k", "100k"),
    Path_("replay_100k", "100k", "100k"),
    Path_("sqs_new", "sqs", systems=SQS, batch="sqs", delivery="new"),
    Path_("sqs_dup", "sqs", systems=SQS, batch="sqs", delivery="redelivery"),
    Path_("kafka_new", "kafka", systems=KAFKA, batch="kafka", delivery="new"),
    Path_("kafka_dup", "kafka", systems=KAFKA, batch="kafka", delivery="redelivery"),
)


@dataclass
class Samples:
    wall_ns: list[int] = field(default_factory=list)
    cpu_ns: list[int] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)
    bytes_sent: int = 0
    runs: int = 0  # handler bodies that ran
    wrong: int = 0  # results that differed from the handler's

    @property
    def n(self) -> int:
        return len(self.wall_ns)


class Worker:
    def __init__(self, system: str, table: str, endpoint: str, log: IO[bytes],
                 env: dict[str, str] | None = None) -> None:
        """`env`: what to change in the worker's environment (bench/floor.py's A/B: another PYTHONPATH)."""
        self.system = system
        self.process = subprocess.Popen(
            [python(), str(BENCH / "worker.py"), system, table],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env={**base_env(endpoint), **(env or {})},
            text=True,
        )
        ready = self._read()
        if ready.get("ready") != system:
            raise RuntimeError(f"worker {system} did not start: {ready}")

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.system} exited with {self.process.wait()} (see bench log)")
        return json.loads(line)

    def run(self, path: Path_, start: int, n: int) -> dict[str, Any]:
        assert self.process.stdin is not None
        command = {"op": "run", "ns": path.namespace, "size": path.size, "keyed": path.keyed, "start": start, "n": n,
                   "batch": path.batch, "delivery": path.delivery}
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        answer = self._read()
        if "fatal" in answer:
            raise RuntimeError(f"{self.system}, path {path.name}: {answer['fatal']}")
        return answer

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write('{"op": "exit"}\n')
            self.process.stdin.flush()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def started(systems: Iterable[str], tables: dict[str, str], endpoint: str, log_path: Path,
            env: dict[str, dict[str, str]] | None = None) -> Iterator[dict[str, Worker]]:
    """A worker per system (`tables`: its table, or the Valkey server's URL; `env`: what to change in a system's
    environment), every one started closed at the end."""
    with open(log_path, "ab") as log:
        workers: dict[str, Worker] = {}
        try:
            for system in systems:
                workers[system] = Worker(system, tables[system], endpoint, log, (env or {}).get(system))
            yield workers
        finally:
            for worker in workers.values():
                worker.close()


def warm_up(workers: dict[str, Worker], systems: Iterable[str], namespace: str, events: int, batch: int = 10) -> None:
    """First executions, then replays, of `events` keys per system, unmeasured: DynamoDB Local is a JVM whose JIT
    settles on the requests it is sent."""
    for name in ("first", "replay"):
        for start in range(0, events, batch):
            for system in systems:
                workers[system].run(Path_(name, namespace), start, batch)


def interleave(workers: dict[str, Worker], paths: Iterable[Path_], iterations: int, warmup: int, progress: Any,
               batch: int = 10, proxy: Any = None,
               count: Callable[[Samples, Any], None] | None = None) -> dict[str, dict[str, Samples]]:
    """path -> system -> samples, over `iterations` measured invocations after `warmup` unmeasured ones (whole
    batches, so no batch's counts mix both): each batch of `batch` events goes to every system of the path in
    turn, the order rotated per batch. A path with `prime` runs each batch once, unmeasured, just before it.
    `proxy` is reset before each run and, after a measured one, read by `count(samples, proxy)`, so its counts
    belong to that run's system alone."""
    warmup = -(-warmup // batch) * batch
    total = warmup + iterations
    samples = {p.name: {s: Samples() for s in p.systems} for p in paths}
    for path in paths:
        progress(f"  {path.name}: {', '.join(path.systems)}")
        for number, start in enumerate(range(0, total, batch)):
            n = min(batch, total - start)
            turn = number % len(path.systems)
            for system in path.systems[turn:] + path.systems[:turn]:
                worker = workers[system]
                if path.prime:
                    worker.run(path, start, n)
                if proxy is not None:
                    proxy.reset()
                answer = worker.run(path, start, n)
                if start < warmup:
                    continue
                row = samples[path.name][system]
                row.wall_ns += answer["wall"]
                row.cpu_ns += answer["cpu"]
                row.runs += answer["runs"]
                row.wrong += answer["wrong"]
                if count is not None:
                    count(row, proxy)
    return samples


def _requests(row: Samples, proxy: CountingProxy) -> None:
    requests, sent = proxy.snapshot()
    for op, number in requests.items():
        row.requests[op] = row.requests.get(op, 0) + number
    row.bytes_sent += sent


def measure(
    proxy: CountingProxy, tables: dict[str, str], iterations: int, warmup: int, batch: int, log_path: Path,
    progress: Any = print,
) -> dict[str, dict[str, Samples]]:
    """path -> system -> samples, over `iterations` measured invocations after `warmup` unmeasured ones, each
    run's requests and bytes counted by the proxy."""
    used = dict.fromkeys(s for p in PATHS for s in p.systems)
    with started(used, tables, proxy.endpoint, log_path) as workers:
        warm_up(workers, MAIN, "warm", 5 * -(-warmup // batch) * batch, batch)
        return interleave(workers, PATHS, iterations, warmup, progress, batch, proxy, _requests)
