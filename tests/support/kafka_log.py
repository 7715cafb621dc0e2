"""A partitioned append-only log on disk and a stand-in for Lambda's Kafka event source mapping reading it.

No Kafka-compatible broker installs from the package registries this project can reach and runs here within
CI's time, so the log is our own: one file per partition, one JSON line per record, a record's offset its line
number, records partitioned by their key as Kafka's default partitioner does (same key, same partition; a
stable hash, not Kafka's murmur2). What it stands in for is the broker's storage and fetch; what it does not
model: replication, retention, leader changes, transactions.

`EventSourceMapping` feeds a function the way Lambda's Kafka event source mapping does in provisioned mode with
ReportBatchItemFailures (https://docs.aws.amazon.com/lambda/latest/dg/kafka-retry-configurations.html): one
poller per execution environment, each owning some partitions (a consumer group's assignment); a batch takes
records from its partitions starting at each one's committed offset, in offset order, across partitions; after
a successful invocation every partition of the batch commits past its last record, except those the answer
reports, which commit at the reported offset (so Lambda resumes there); an invocation that errors, answers
something invalid or times out commits nothing, so the whole batch comes again. Rebalances move partitions
between pollers; a poller whose partition moved while its batch ran cannot commit it (the group's generation
fences it), as Kafka refuses a commit from an old generation. With `partial=False` it plays a mapping that
ignores `batchItemFailures` (no ReportBatchItemFailures, or not in provisioned mode): any answer but an error
commits the whole batch.
"""

from __future__ import annotations

import base64
import json
import random
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

TIMEOUT = "timeout"  # what an invoker returns when the invocation timed out


class PartitionedLog:
    """An append-only log of `partitions` partitions of one topic, one file each under `directory`."""

    def __init__(self, directory: Path, topic: str, partitions: int) -> None:
        self.topic = topic
        self.paths = [directory / f"{topic}-{p}.log" for p in range(partitions)]
        self._positions: list[list[int]] = [[] for _ in range(partitions)]  # byte position of each offset
        self._lock = threading.Lock()
        for path in self.paths:
            path.write_bytes(b"")

    @property
    def partitions(self) -> int:
        return len(self.paths)

    def partition_of(self, key: bytes) -> int:
        return zlib.crc32(key) % self.partitions

    def append(self, key: bytes, value: bytes) -> tuple[int, int]:
        """Append a record; return its (partition, offset)."""
        partition = self.partition_of(key)
        with self._lock:
            offset = len(self._positions[partition])
            line = json.dumps({"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode(),
                               "timestamp": int(time.time() * 1000)}) + "\n"
            with self.paths[partition].open("ab") as f:
                self._positions[partition].append(f.tell())
                f.write(line.encode())
            return partition, offset

    def end(self, partition: int) -> int:
        """The offset the next record of `partition` will get (Kafka's log end offset)."""
        with self._lock:
            return len(self._positions[partition])

    def read(self, partition: int, offset: int, limit: int) -> list[dict[str, Any]]:
        """Up to `limit` records of `partition` from `offset` on, as Lambda's Kafka event carries them."""
        with self._lock:
            positions = self._positions[partition][offset:offset + limit]
        records = []
        with self.paths[partition].open("rb") as f:
            for i, position in enumerate(positions):
                f.seek(position)
                stored = json.loads(f.readline())
                records.append({"topic": self.topic, "partition": partition, "offset": offset + i,
                                "timestamp": stored["timestamp"], "timestampType": "CREATE_TIME",
                                "key": stored["key"], "value": stored["value"], "headers": []})
        return records


class EventSourceMapping:
    """Lambda's Kafka event source mapping, provisioned mode, ReportBatchItemFailures; see the module's doc.

    `invokers` are one callable per execution environment: event -> (HTTP status, body bytes) or TIMEOUT."""

    def __init__(self, log: PartitionedLog, invokers: list[Callable[[dict[str, Any]], Any]], cluster: str,
                 batch_size: int = 10, lose_every: int = 0, rebalance_every: int = 0, seed: int = 0,
                 partial: bool = True) -> None:
        self.log, self.invokers, self.cluster, self.batch_size = log, invokers, cluster, batch_size
        # False: a mapping outside provisioned mode or without ReportBatchItemFailures, which ignores
        # batchItemFailures and commits the whole batch on any answer that is not an error.
        self.partial = partial
        self.lose_every, self.rebalance_every = lose_every, rebalance_every
        self.rng = random.Random(seed)
        self.committed = [0] * log.partitions
        self.owner = [p % len(invokers) for p in range(log.partitions)]
        self.generation = [0] * log.partitions
        self.delivered = [0] * log.partitions  # highest offset delivered + 1: what comes again is a redelivery
        self.counts: Counter[str] = Counter()
        self.problems: list[str] = []
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._poll, args=(i,), name=f"esm-poller-{i}", daemon=True)
                         for i in range(len(invokers))]

    def start(self) -> EventSourceMapping:
        for thread in self._threads:
            thread.start()
        return self

    def close(self, timeout: float = 120) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def caught_up(self) -> bool:
        with self._lock:
            return all(self.committed[p] == self.log.end(p) for p in range(self.log.partitions))

    def _problem(self, text: str) -> None:
        with self._lock:
            self.counts["problems"] += 1
            if len(self.problems) < 20:
                self.problems.append(text)

    def _poll(self, poller: int) -> None:
        try:
            while not self.stop.is_set():
                if not self._once(poller):
                    time.sleep(0.01)
        except BaseException as error:  # surfaced by the test
            self.errors.append(error)
            self.stop.set()

    def _fetch(self, poller: int) -> tuple[dict[int, list[dict[str, Any]]], dict[int, int]]:
        """A batch from the poller's partitions, from each committed offset, up to batch_size records."""
        with self._lock:
            mine = [p for p in range(self.log.partitions) if self.owner[p] == poller]
            self.rng.shuffle(mine)
            starts = {p: self.committed[p] for p in mine}
            generations = {p: self.generation[p] for p in mine}
        batch: dict[int, list[dict[str, Any]]] = {}
        room = self.batch_size
        for p in mine:
            if room <= 0:
                break
            records = self.log.read(p, starts[p], room)
            if records:
                batch[p] = records
                room -= len(records)
        return batch, generations

    def _once(self, poller: int) -> bool:
        batch, generations = self._fetch(poller)
        if not batch:
            return False
        with self._lock:
            for p, records in batch.items():
                self.counts["records"] += len(records)
                self.counts["redelivered"] += sum(r["offset"] < self.delivered[p] for r in records)
                self.delivered[p] = max(self.delivered[p], records[-1]["offset"] + 1)
            self.counts["invocations"] += 1
            invocation = self.counts["invocations"]
            if self.rebalance_every and invocation % self.rebalance_every == 0:
                # A member joins or leaves: every partition moves to the next poller, a new generation.
                self.owner = [(o + 1) % len(self.invokers) for o in self.owner]
                self.generation = [g + 1 for g in self.generation]
                self.counts["rebalances"] += 1
        event = {"eventSource": "aws:kafka", "eventSourceArn": self.cluster,
                 "bootstrapServers": "b-1.soak.kafka.example.com:9098",
                 "records": {f"{self.log.topic}-{p}": records for p, records in batch.items()}}
        answer = self.invokers[poller](event)
        if answer == TIMEOUT or (self.lose_every and self.rng.randrange(self.lose_every) == 0):
            # Lambda saw no answer in time (the function may well have finished): the whole batch comes again.
            with self._lock:
                self.counts["timed_out"] += 1
            return True
        resume = self._resume_offsets(batch, *answer)
        if resume is None:
            return True  # an error or an invalid answer: the whole batch comes again
        with self._lock:
            for p, offset in resume.items():
                if self.generation[p] != generations[p]:
                    self.counts["fenced"] += 1  # the partition moved on: Kafka refuses this commit
                elif self.committed[p] == batch[p][0]["offset"]:
                    self.committed[p] = offset
        return True

    def _resume_offsets(self, batch: dict[int, list[dict[str, Any]]], status: int,
                        body: bytes) -> dict[int, int] | None:
        """Where each partition of the batch resumes after this answer, or None when the whole batch comes again."""
        try:
            value = json.loads(body)
        except ValueError:
            self._problem(f"an answer that is not JSON: {status} {body[:300]!r}")
            return None
        if status != 200 or (isinstance(value, dict) and "errorType" in value):
            with self._lock:
                self.counts["errored"] += 1
            error_type = value.get("errorType") if isinstance(value, dict) else None
            self._problem(f"an errored invocation ({error_type}): {status} {body[:300]!r}")
            return None
        resume = {p: records[-1]["offset"] + 1 for p, records in batch.items()}
        items = value.get("batchItemFailures") if isinstance(value, dict) else None
        if not items:
            return resume
        if not self.partial:  # ignored: the reported records are lost
            with self._lock:
                self.counts["ignored_reports"] += len(items) if isinstance(items, list) else 1
            return resume
        names = {f"{self.log.topic}-{p}": p for p in batch}
        reported: dict[int, int] = {}
        for item in items:
            identifier = item.get("itemIdentifier") if isinstance(item, dict) else None
            partition = names.get(identifier.get("partition")) if isinstance(identifier, dict) else None
            offset = identifier.get("offset") if isinstance(identifier, dict) else None
            if (partition is None or type(offset) is not int
                    or not batch[partition][0]["offset"] <= offset <= batch[partition][-1]["offset"]):
                self._problem(f"an invalid batchItemFailures item: {item!r}")  # Lambda fails the whole batch
                return None
            reported[partition] = min(offset, reported.get(partition, offset))
        with self._lock:
            self.counts["stops"] += len(reported)
        return {**resume, **reported}
