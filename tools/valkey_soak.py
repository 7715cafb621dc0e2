"""The Valkey soak (`./build.sh chaos --valkey`, `python -m tools.valkey_soak`): the DynamoDB soak's copies,
duplicates, kills, overruns, skewed clocks and verdict (tools/chaos.py), against a real Valkey server.

The layer runs with IDEMPOTENCY_STORE=valkey. Between it and the server a RESP proxy faults a share of the store's
commands (`EVALSHA`, `EVAL`, `HGETALL`, `HMGET`), evenly:

    cut    the connection closed before the command is forwarded (it did not run)
    drop   forwarded (it ran), then the connection closed instead of the answer
    delay  forwarded, and answered 0.2 to 1 s late

and the server itself is SIGKILLed and started again, on the same port, `restarts` times during the run (evenly
spread over the run's expected length). It runs with the append-only file and `appendfsync always`, as
docs/valkey.md asks of a self-managed server: every write it acknowledged is on disk before the answer, so a
restart loses none (a claim or a completion it did not acknowledge may or may not be there, which the layer treats
as uncertain). The verdict is the DynamoDB soak's, from the handler's own side-effect lines: doubles, early
re-runs, divergent answers, lost copies, stuck records (read from the server once every claim could have ended).

    python -m tools.valkey_soak [--invocations N] [--seed S] [--restarts R] [--server valkey9|redis7] ...
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tests.support.resp_proxy import CUT, DELAY, DROP, RespProxy
from tests.support.valkey_server import Server
from tools import chaos
from tools.chaos import runtime_python

KINDS = (CUT, DROP, DELAY)
FAULTED = frozenset({"EVALSHA", "EVAL", "HGETALL", "HMGET"})  # the store's own commands (not INFO, AUTH, SCRIPT)


class FaultyProxy(RespProxy):
    """`RespProxy` drawing a fault for a share `rate` of the store's commands, seeded, counted per kind."""

    def __init__(self, upstream_port: int, *, rate: float, seed: int, spike: tuple[float, float]) -> None:
        self.rate = rate
        self.spike = spike
        self._rng = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self._drawn = threading.local()
        super().__init__(upstream_port)
        self.endpoint = self.url  # what the soak's environments are given

    def _fault(self, name: str) -> str | None:
        scripted = super()._fault(name)
        if scripted is not None or name not in FAULTED:
            return scripted
        with self._lock:
            self.counts["requests"] += 1
            if self._rng.random() >= self.rate:
                return None
            kind = self._rng.choice(KINDS)
            self.counts[kind] += 1
            self._drawn.delay = self._rng.uniform(*self.spike)
        return kind

    @property  # type: ignore[override]
    def delay(self) -> float:  # what DELAY sleeps: this thread's last drawn spike
        return float(getattr(self._drawn, "delay", 0.0))

    @delay.setter
    def delay(self, value: float) -> None:  # RespProxy's __init__ sets it
        pass

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"requests": self.counts["requests"], "upstream_error": 0,
                    **{kind: 0 for kind in chaos.KINDS}, **{kind: self.counts[kind] for kind in KINDS}}

    def operations(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {name: {"seen": count} for name, count in self.commands.items()}

    def faults(self) -> int:
        with self._lock:
            return sum(self.counts[kind] for kind in KINDS)


class ValkeySoak(chaos.Soak):
    """`chaos.Soak` with its store a Valkey server behind `FaultyProxy`, restarted `restarts` times."""

    def __init__(self, settings: chaos.Settings, *, work: Path, python: Path, python_version: str, opt_dir: Path,
                 server_kind: str = "valkey9", restarts: int = 1, say: Any = print) -> None:
        super().__init__(settings, work=work, dynamodb_endpoint="http://127.0.0.1:9", python=python,
                         python_version=python_version, opt_dir=opt_dir, say=say)
        self.server_kind = server_kind
        self.restarts = restarts
        self.restarted: list[float] = []  # when (seconds into the run) the server came back each time
        self.server: Server | None = None
        self._done = threading.Event()

    def run(self) -> dict[str, Any]:
        s = self.settings
        self.task_root.mkdir(parents=True)
        self.logs.mkdir()
        shutil.copy(chaos.APP, self.task_root / chaos.APP.name)
        self.server = Server(self.server_kind, extra=("--appendonly", "yes", "--appendfsync", "always")).start()
        self.proxy = FaultyProxy(self.server.port, rate=s.fault_rate, seed=s.seed,  # type: ignore[assignment]
                                 spike=(s.spike_ms[0] / 1000, s.spike_ms[1] / 1000))
        workers: list[chaos.Worker] = []
        restarter = threading.Thread(target=self._restart, name="valkey-restarts", daemon=True)
        try:
            workers += [chaos.Worker(self, slot) for slot in range(s.environments)]
            self.started = time.monotonic()
            for worker in workers:
                worker.start()
            restarter.start()
            self._watch(workers)
            self.ended = time.monotonic()
            self._done.set()
            restarter.join(60)
            errors = [worker.error for worker in workers if worker.error is not None]
            if errors:
                raise RuntimeError(f"a caller failed: {errors[0]!r}") from errors[0]
            return self._report(None)
        finally:
            self._done.set()
            self._close(workers)
            self.proxy.close()
            self.server.close()

    def _restart(self) -> None:
        """Kill the server and start it again, `restarts` times, spread over the run while copies are unsettled."""
        assert self.server is not None
        for n in range(self.restarts):
            target = (n + 1) / (self.restarts + 1)  # a share of the copies settled
            while not self._done.is_set() and (len(self.copies) - self.schedule.open) < target * len(self.copies):
                time.sleep(0.1)
            if self._done.is_set():
                return
            self.server.restart()  # SIGKILL, then the same port and directory: the append-only file replayed
            self.restarted.append(round(time.monotonic() - self.started, 1))
            self.say(f"  ... Valkey killed and started again ({len(self.restarted)} of {self.restarts})")

    def variables(self, *, endpoint: str, table: str, runs_file: Path, skewed: bool) -> dict[str, str]:
        variables = super().variables(endpoint=endpoint, table=table, runs_file=runs_file, skewed=skewed)
        del variables["AWS_ENDPOINT_URL_DYNAMODB"], variables["IDEMPOTENCY_TABLE"]
        return {**variables, "IDEMPOTENCY_STORE": "valkey", "IDEMPOTENCY_VALKEY_URL": endpoint}

    def _records(self, client: Any) -> list[dict[str, Any]]:
        """The server's records, in the DynamoDB item shape the DynamoDB soak's report reads."""
        import valkey

        assert self.server is not None
        direct = valkey.Valkey(host="127.0.0.1", port=self.server.port)
        try:
            items = []
            for key in direct.scan_iter(count=1000):
                fields = direct.hgetall(key)
                if b"s" not in fields:
                    continue
                item = {"id": {"S": key.decode()}, "status": {"S": fields[b"s"].decode()}}
                if b"u" in fields:
                    item["in_progress_until"] = {"N": fields[b"u"].decode()}
                if b"f" in fields:
                    item["result_format"] = {"S": fields[b"f"].decode()}
                items.append(item)
            return items
        finally:
            direct.close()

    def _report(self, client: Any) -> dict[str, Any]:
        report = super()._report(client)
        figures = report["figures"]
        assert isinstance(self.proxy, FaultyProxy)
        counts = self.proxy.snapshot()
        figures["faults"] = {kind: counts[kind] for kind in KINDS}
        figures["faults_total"] = sum(figures["faults"].values())
        figures["restarts"] = len(self.restarted)
        figures["restarted_at_s"] = self.restarted
        report["settings"].update(store=f"valkey ({self.server_kind})", restarts=self.restarts)
        return report


def soak(settings: chaos.Settings, *, work: Path, opt_dir: Path, server_kind: str = "valkey9", restarts: int = 1,
         say: Any = print) -> dict[str, Any]:
    """Run one Valkey soak in `work` (empty or missing); the report as `report_lines` prints it."""
    version, python = runtime_python(settings.python)
    work.mkdir(parents=True, exist_ok=True)
    # The timeout is as given (the probe that fits it, chaos.Soak.measure, runs on DynamoDB Local); the attempt
    # budget spans as many killed claims at that timeout as the DynamoDB soak's does at 4 s, and restarts add to it.
    settings = replace(settings, fit_timeout=False,
                       attempts=max(settings.attempts, chaos.fitted_attempts(settings, settings.timeout) + 5))
    report = ValkeySoak(settings, work=work, python=python, python_version=version, opt_dir=opt_dir,
                        server_kind=server_kind, restarts=restarts, say=say).run()
    report["settings"]["python"] = version
    return report


def report_lines(report: dict[str, Any]) -> list[str]:
    f = report["figures"]
    lines = chaos.report_lines(report)
    lines[0] = lines[0].replace("chaos soak,", f"Valkey soak ({report['settings']['store']}),", 1)
    lines.insert(1, f"  the server killed and started again {f['restarts']} time(s), at {f['restarted_at_s']} s "
                    "(append-only file, appendfsync always)")
    return lines


ZEROS = ("doubles", "early", "divergent", "lost", "stuck", "unexpected")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--invocations", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--server", choices=("valkey9", "redis7"), default="valkey9")
    parser.add_argument("--faults", type=float, default=0.05, help="share of the store's commands faulted")
    parser.add_argument("--kills", type=float, default=0.02, help="share of invocations whose environment is killed")
    parser.add_argument("--timeout", type=int, default=6, help="the function's timeout, seconds")
    parser.add_argument("--skew", type=float, default=0.0, help="every second environment's clock this far ahead")
    parser.add_argument("--environments", type=int, default=chaos.Settings.environments)
    parser.add_argument("--json", type=Path, help="write the whole report here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, chaos._terminated)
    settings = chaos.Settings(invocations=args.invocations, seed=args.seed, fault_rate=args.faults,
                              kill_rate=args.kills, timeout=args.timeout, skew_s=args.skew,
                              environments=args.environments)
    import tempfile

    from tests.support.rie import ensure_layer, unpack_layer

    with tempfile.TemporaryDirectory(prefix="valkey-soak-") as scratch:
        opt = unpack_layer(ensure_layer(), Path(scratch) / "opt")
        report = soak(settings, work=Path(scratch) / "soak", opt_dir=opt, server_kind=args.server,
                      restarts=args.restarts)
    print("\n".join(report_lines(report)))
    if args.json:
        args.json.write_text(json.dumps({**report, "settings": {**asdict(settings), **report["settings"]}},
                                        indent=1, default=str))
    failed = {name: report["figures"][name] for name in ZEROS if report["figures"][name]}
    if failed:
        print(f"FAILED: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
