"""The floor: what plain `http.client` costs to send the layer's own requests and read the same answers.

The client stays on `http.client` (docs/design.md), so no layer on it can cost less per invocation than the
round trips it makes. A floor worker captures the exact requests the layer writes for one event (the claim and
the completion of a first execution, as bytes on the socket), and then, for every event, sends them again
through a plain `http.client.HTTPConnection` (putrequest, putheader, endheaders, getresponse, read) with the
event's key and order id put in their place: a claim, and when it is answered 200 the handler and the
completion; when it is refused (a replay) nothing more, as the layer. What is not the floor's work is done
outside the timed call (`prepare`: the key's hash and the bodies). The signature is the capture's:
DynamoDB Local does not check it, and the floor costs no signing.

    measure(...)   the layer, the floor and Powertools, with and without a session token, interleaved
    ab(...)        the layer against the layer of another revision (`run.py --ab REV`), interleaved

Both report medians of CPU per invocation (`time.process_time`) and their ratios; neither asserts anything.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from common import ROOT
from stats import median_ms
from tables import table

FLOOR_SYSTEMS = ("layer", "floor", "powertools", "layer+token", "floor+token")
# The capture's event: the same order id but for its last five digits, "x" and four of this process's own (no
# event's, and no other floor's on the table: the capture must be a first execution).
_CAPTURE_INDEX = "x" + os.urandom(2).hex()


class Floor:
    """The floor as a handler: built in a worker process from the layer's own settings (`env`)."""

    def __init__(self, env: dict[str, str], handler: Any) -> None:
        os.environ.update(env)
        from idempotency_layer import interceptor
        from idempotency_layer.keys import KeyDeriver

        config = interceptor.CONFIG
        self._layer = interceptor.handler
        self._keys = KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath)
        self._handler = handler
        host, _, port = env["AWS_ENDPOINT_URL_DYNAMODB"].partition("://")[2].partition(":")
        self._connection = http.client.HTTPConnection(host, int(port))
        self._templates: tuple[Any, Any] | None = None
        self._captured = (b"", b"")  # the capture's key and order id, as they are written in its requests
        self._next: tuple[Any, Any] | None = None

    def _capture(self, event: dict[str, Any]) -> tuple[Any, Any]:
        """The layer's claim and completion for `event` as written on the socket: (head lines, body) each."""
        import bench_handler
        from common import Context

        from idempotency_layer.stores.dynamodb import http_connection

        written: list[bytes] = []
        original = http_connection.Connection.send
        runs = bench_handler.RUNS

        def record(self_: Any, data: Any) -> None:
            body = self_._body
            written.append(bytes(data) + (body or b""))
            original(self_, data)

        http_connection.Connection.send = record  # type: ignore[method-assign]
        try:
            self._layer(event, Context())
        finally:
            http_connection.Connection.send = original  # type: ignore[method-assign]
            bench_handler.RUNS = runs  # the capture's run is not the floor's
        if len(written) != 2:
            raise RuntimeError(f"the layer wrote {len(written)} requests for a first execution, not 2")
        requests = []
        for data in written:
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = [tuple(line.split(": ", 1)) for line in lines[1:]]
            requests.append((lines[0].split(" ")[1], headers, body))
        return requests[0], requests[1]

    def prepare(self, event: dict[str, Any]) -> None:
        """Outside the timed call: the requests for `event`, from the capture with its key and order id put in (and
        Content-Length with them, should an order id be of another length)."""
        order = event["orderId"]
        if self._templates is None:
            capture = dict(event, orderId=order[:-5] + _CAPTURE_INDEX)
            self._captured = (self._keys.key(capture).encode(), capture["orderId"].encode())
            self._templates = self._capture(capture)
        old = self._captured
        new = (self._keys.key(event).encode(), order.encode())
        made = []
        for target, headers, body in self._templates:
            if old[0] not in body:
                raise RuntimeError("the captured request does not hold the capture's key")
            body = body.replace(old[0], new[0]).replace(old[1], new[1])
            made.append((target, [(name, str(len(body)) if name.lower() == "content-length" else value)
                                  for name, value in headers], body))
        self._next = (made[0], made[1])

    def _send(self, request: Any) -> int:
        target, headers, body = request
        connection = self._connection
        connection.putrequest("POST", target, skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
            connection.putheader(name, value)
        connection.endheaders(body)
        response = connection.getresponse()
        response.read()
        return response.status

    def __call__(self, event: dict[str, Any], context: Any) -> Any:
        assert self._next is not None, "prepare(event) comes first"
        claim, complete = self._next
        status = self._send(claim)
        if status != 200:
            return None  # refused: a replay (the worker checks no floor result)
        result = self._handler(event, context)
        if self._send(complete) != 200:
            raise RuntimeError("the floor's completion was refused")
        return result


def measure(endpoint: str, tables: dict[str, str], iterations: int, warmup: int, log_path: Path,
            progress: Any = print, warm: int = 0) -> dict[str, Any]:
    """Per path: each system's CPU median, and the layer's ratios to the floor and to Powertools. `warm`: see
    inprocess.warm_up (run.py's full run has warmed DynamoDB Local already)."""
    from inprocess import Path_, interleave, started, warm_up  # the parent's (workers import this without tests/)

    paths = (Path_("first", "floor", systems=FLOOR_SYSTEMS), Path_("replay", "floor", systems=FLOOR_SYSTEMS))
    with started(FLOOR_SYSTEMS, tables, endpoint, log_path) as workers:
        warm_up(workers, FLOOR_SYSTEMS, "warm-floor", warm)
        samples = interleave(workers, paths, iterations, warmup, progress)
    rows: dict[str, Any] = {}
    for path in paths:
        cpu = {s: median_ms(samples[path.name][s].cpu_ns) for s in path.systems}
        runs = {s: samples[path.name][s].runs for s in path.systems}
        expected = iterations if path.name == "first" else 0
        if any(count != expected for count in runs.values()):
            raise RuntimeError(f"floor rows, {path.name}: handler runs {runs}, expected {expected} each")
        of = samples[path.name]
        rows[path.name] = {"cpu_p50_ms": cpu, "n": len(of["layer"].cpu_ns),
                           "layer_over_floor": paired_ratio(of["layer"].cpu_ns, of["floor"].cpu_ns),
                           "layer_over_floor_token": paired_ratio(of["layer+token"].cpu_ns, of["floor+token"].cpu_ns),
                           "layer_over_powertools": paired_ratio(of["layer"].cpu_ns, of["powertools"].cpu_ns),
                           "wrong_results": of["layer"].wrong}
    return rows


def render(rows: dict[str, Any]) -> str:
    header = ["path", "layer ms", "floor ms", "layer / floor", "with a session token: layer ms", "floor ms",
              "layer / floor", "Powertools ms", "layer / Powertools"]
    lines = [[name, f"{cpu['layer']:.3f}", f"{cpu['floor']:.3f}", f"{row['layer_over_floor']:.2f}",
              f"{cpu['layer+token']:.3f}", f"{cpu['floor+token']:.3f}", f"{row['layer_over_floor_token']:.2f}",
              f"{cpu['powertools']:.3f}", f"{row['layer_over_powertools']:.2f}"]
             for name, row in rows.items() for cpu in (row["cpu_p50_ms"],)]
    return ("\nThe floor: CPU per invocation against plain http.client sending the layer's own requests (medians, "
            "in-process, interleaved; ratios: the median of paired batches' ratios)\n" + table(header, lines, True))


# -- A/B: the layer against another revision's ---------------------------------------------------------------


def checkout(revision: str, into: Path) -> Path:
    """The layer's package as it is at `revision` (git archive), unpacked under `into`; its source root."""
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "layer.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), revision,
                    "layer/idempotency_layer"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "layer"


def ab(endpoint: str, tables: dict[str, str], revision: str, iterations: int, warmup: int, log_path: Path,
       progress: Any = print, rounds: int = 8) -> dict[str, Any]:
    """The working tree's layer ("layer") against `revision`'s ("layer@base"), with and without a session
    token, first executions and replays, interleaved; medians and B/A (this tree over the revision).
    `revision` "A..B": revision B's layer in place of the working tree's.

    In `rounds` rounds, each with new worker processes and keys: a process's own luck (where its memory lies)
    moves its figures by a few percent for its whole life, so one pair of processes would measure that too."""
    from common import base_env
    from inprocess import Path_, Samples, interleave, started, warm_up

    systems = ("layer@base", "layer", "layer+token@base", "layer+token")
    names = ("first", "replay")
    pooled = {name: {s: Samples() for s in systems} for name in names}
    with tempfile.TemporaryDirectory(prefix="idempotency-ab-") as tmp:
        base, _, other = revision.partition("..")
        sources = {"@": checkout(base, Path(tmp) / "a")}
        if other:
            sources[""] = checkout(other, Path(tmp) / "b")
        python_path = base_env(endpoint)["PYTHONPATH"].split(os.pathsep)
        # One hash seed for all four, so string hashing lays their dicts out alike.
        env = {s: {"PYTHONHASHSEED": "0"} for s in systems}
        for system in systems:
            source = sources.get("@" if "@" in system else "")
            if source is not None:
                env[system]["PYTHONPATH"] = os.pathsep.join([python_path[0], str(source)])
        for number in range(rounds):
            paths = tuple(Path_(name, f"ab{number}", systems=systems) for name in names)
            with started(systems, tables, endpoint, log_path, env) as workers:
                if number == 0:
                    warm_up(workers, systems, "warm-ab", 500)
                samples = interleave(workers, paths, -(-iterations // rounds), warmup,
                                     lambda m, n=number: progress(f"  round {n + 1} of {rounds}:{m[1:]}"))
            for name in names:
                for system in systems:
                    pooled[name][system].cpu_ns += samples[name][system].cpu_ns
    rows: dict[str, Any] = {}
    for name in names:
        cpu = {s: median_ms(pooled[name][s].cpu_ns) for s in systems}
        saved = _paired(pooled[name]["layer@base"].cpu_ns, pooled[name]["layer"].cpu_ns)
        saved_token = _paired(pooled[name]["layer+token@base"].cpu_ns, pooled[name]["layer+token"].cpu_ns)
        # B / A: what B saves, paired, over A's median (the pooled medians' own ratio moves with the machine).
        rows[name] = {"cpu_p50_ms": cpu, "n": len(pooled[name]["layer"].cpu_ns), "saved_us": saved,
                      "b_over_a": 1 - saved / 1000 / cpu["layer@base"], "saved_us_token": saved_token,
                      "b_over_a_token": 1 - saved_token / 1000 / cpu["layer+token@base"]}
    return rows


def _batch_medians(a: list[int], b: list[int], batch: int = 10) -> list[tuple[float, float]]:
    """(A's median, B's median) of each pair of batches, run one after the other: compared pair by pair, the
    machine's drift over a run (its figures move by a tenth and more) cancels out."""
    import statistics

    return [(statistics.median(a[i:i + batch]), statistics.median(b[i:i + batch]))
            for i in range(0, min(len(a), len(b)), batch)]


def paired_ratio(a: list[int], b: list[int]) -> float:
    """A over B: the median of paired batches' ratios."""
    import statistics

    ratios = [x / y for x, y in _batch_medians(a, b)]
    return statistics.median(ratios) if ratios else float("nan")


def _paired(a: list[int], b: list[int]) -> float:
    """What B saves on A, in microseconds: the median of paired batches' differences."""
    import statistics

    differences = [x - y for x, y in _batch_medians(a, b)]
    return statistics.median(differences) / 1000 if differences else float("nan")


def render_ab(revision: str, rows: dict[str, Any]) -> str:
    base, _, other = revision.partition("..")
    header = ["path", "A ms", "B ms", "saved us", "B / A", "with a token: A ms", "B ms", "saved us", "B / A"]
    lines = [[name, f"{cpu['layer@base']:.3f}", f"{cpu['layer']:.3f}", f"{row['saved_us']:.1f}",
              f"{row['b_over_a']:.3f}", f"{cpu['layer+token@base']:.3f}", f"{cpu['layer+token']:.3f}",
              f"{row['saved_us_token']:.1f}", f"{row['b_over_a_token']:.3f}"]
             for name, row in rows.items() for cpu in (row["cpu_p50_ms"],)]
    return (f"\nA/B: {other or 'this tree'} (B) against {base} (A), CPU per invocation (medians, in-process, "
            "interleaved, eight rounds of fresh processes; saved: the median of paired batches' differences)\n"
            + table(header, lines, True))
