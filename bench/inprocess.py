"""Steady-state invocations in-process: every system in its own worker, the same events, in lockstep.

Only one worker runs at a time (the machine has two shared cores, and DynamoDB Local and the proxy need
them too). Each batch goes to every system in turn, the order rotated per batch, so drift in the machine's
load spreads over all systems alike. The counting proxy is reset before each batch and read after it, so its
counts belong to that batch's system alone.

The SQS rows invoke SQS batches (each invocation one batch of SQS_BATCH messages) on their own two workers:
an unmodified consumer under the layer, and Powertools' batch processor with idempotent_function per record.
The Kafka rows do the same with MSK batches of SQS_BATCH records over KAFKA_PARTITIONS partitions, on three
workers: the layer with IDEMPOTENCY_BATCH_PRECHECK's default (auto) and with `always`, and Powertools.
A worker that finds a record's work ran other than once stops the bench (RuntimeError).
"""

from __future__ import annotations

import json
import subprocess
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


def measure(
    proxy: CountingProxy, tables: dict[str, str], iterations: int, warmup: int, batch: int, log_path: Path,
    progress: Any = print,
) -> dict[str, dict[str, Samples]]:
    """path -> system -> samples, over `iterations` measured invocations after `warmup` unmeasured ones."""
    warmup = -(-warmup // batch) * batch  # whole batches, so no batch's request counts mix both
    results: dict[str, dict[str, Samples]] = {p.name: {s: Samples() for s in p.systems} for p in PATHS}
    with open(log_path, "ab") as log:
        used = dict.fromkeys(s for p in PATHS for s in p.systems)
        workers = {s: Worker(s, tables[s], proxy.endpoint, log) for s in used}
        try:
            # DynamoDB Local is a JVM: let its JIT settle on these requests before anything is measured.
            for warm in (Path_("warm", "warm"), Path_("warm", "warm", prime=True)):
                for start in range(0, 5 * warmup, batch):
                    for system in MAIN:
                        workers[system].run(warm, start, batch)
            for path in PATHS:
                progress(f"  {path.name}: {', '.join(path.systems)}")
                total = warmup + iterations
                for number, start in enumerate(range(0, total, batch)):
                    n = min(batch, total - start)
                    turn = number % len(path.systems)
                    for system in path.systems[turn:] + path.systems[:turn]:
                        worker = workers[system]
                        if path.prime:
                            worker.run(path, start, n)
                        proxy.reset()
                        answer = worker.run(path, start, n)
                        requests, sent = proxy.snapshot()
                        if start < warmup:
                            continue
                        samples = results[path.name][system]
                        samples.wall_ns += answer["wall"]
                        samples.cpu_ns += answer["cpu"]
                        for op, count in requests.items():
                            samples.requests[op] = samples.requests.get(op, 0) + count
                        samples.bytes_sent += sent
                        samples.runs += answer["runs"]
                        samples.wrong += answer["wrong"]
        finally:
            for worker in workers.values():
                worker.close()
    return results


def interleave(endpoint: str, tables: dict[str, str], paths: tuple[Path_, ...], iterations: int, warmup: int,
                log_path: Path, progress: Any, env: dict[str, dict[str, str]] | None = None,
                batch: int = 10, warm: int = 0) -> dict[str, dict[str, Samples]]:
    """path -> system -> samples: each batch of `batch` events to every system in turn, the order rotated.
    `warm`: first executions and replays each system runs, unmeasured, before the paths (DynamoDB Local is a JVM
    whose JIT settles on the requests it is sent)."""
    systems = tuple(dict.fromkeys(s for p in paths for s in p.systems))
    samples = {p.name: {s: Samples() for s in p.systems} for p in paths}
    warmup = -(-warmup // batch) * batch
    with open(log_path, "ab") as log:
        workers = {s: Worker(s, tables[s], endpoint, log, (env or {}).get(s)) for s in systems}
        try:
            for start in range(0, warm, batch):
                for system in systems:
                    for name in ("first", "replay"):
                        workers[system].run(Path_(name, "warm-" + paths[0].namespace), start, batch)
            for path in paths:
                progress(f"  {path.name}: {', '.join(path.systems)}")
                total = warmup + iterations
                for number, start in enumerate(range(0, total, batch)):
                    turn = number % len(path.systems)
                    for system in path.systems[turn:] + path.systems[:turn]:
                        answer = workers[system].run(path, start, min(batch, total - start))
                        if start >= warmup:
                            row = samples[path.name][system]
                            row.cpu_ns += answer["cpu"]
                            row.runs += answer["runs"]
                            row.wrong += answer["wrong"]
        finally:
            for worker in workers.values():
                worker.close()
    return samples
