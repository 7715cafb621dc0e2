"""The side-by-side benchmark: this layer, Powertools' @idempotent and the bare handler.

    ./build.sh bench            (or .venv/bin/python bench/run.py [--quick] [--no-init] [--no-e2e] [--no-profile])

One run, one DynamoDB Local behind one counting proxy, the same events for every system:
  1. steady state in-process (bench/inprocess.py): wall, CPU, requests and bytes per invocation, per path;
     1b. the floor (bench/floor.py): plain http.client sending the layer's own requests, with and without a
     session token, and the layer's ratio to it (alone: `bench/run.py --only-floor`);
  2. init in fresh processes (bench/initbench.py): time and peak RSS to "ready for the first event", against
     the proxy over http and, through a TLS forwarder on loopback (bench/tls.py), over https;
  3. end to end under the Runtime Interface Emulator (bench/rie_bench.py): the function bare, with the layer and
     with Powertools;
  4. where the layer's hot path spends its CPU (bench/profile_hot.py): parts timed in place, alone, and cProfile
     (alone: `bench/run.py --only-profile`, the in-place table);
  5. what metrics cost: the layer's CPU per invocation with IDEMPOTENCY_METRICS=emf over without (`_metrics_cost`;
     alone: `bench/run.py --only-metrics-cost`);
  6. the Valkey store against Powertools' CachePersistenceLayer on one Valkey server (bench/valkey_bench.py;
     alone: `bench/run.py --only-valkey`);
  7. what a result kept in S3 costs against a small one (bench/large_bench.py; alone: `bench/run.py --only-large`).
`bench/run.py --ab A..B` compares two revisions' layers (or the working tree's against A): CPU per invocation,
interleaved, in eight rounds of fresh processes, the saving as the median of paired batches' differences.
It reports; it asserts nothing about speed. Output: a table on stdout, bench/results.json, bench/ratios.png and
bench/README-section.md, the benchmark section to paste into docs/performance.md below its introduction.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests.support, after bench/ itself

import inprocess
import report
from common import BENCH, CREDENTIALS, E2E_POWERTOOLS_TABLE, SQS_BATCH, SYSTEMS
from tables import table

from tests.support.counting_proxy import CountingProxy
from tests.support.dynamodb_local import DynamoDBLocal, create_table


def _tables(endpoint: str, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """A table per system of SYSTEMS (and per name in `extra`: floor.ab's "layer@base"), and the init's."""
    import boto3

    client = boto3.client(
        "dynamodb", endpoint_url=endpoint, region_name=CREDENTIALS["AWS_REGION"],
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    tables: dict[str, str] = {}
    for system, (kind, _) in [*SYSTEMS.items(), *((name, ("layer", {})) for name in extra)]:
        name = "bench-" + system.replace("+", "-").replace("@", "-")
        if kind != "bare":  # each library's own record layout and TTL attribute, one table per worker
            create_table(client, name, ttl_attr="expiration" if kind == "powertools" else "expires_at")
        tables[system] = name
    # The init probes' table (bench/initbench.py): the layer checks its table's key schema at init.
    create_table(client, "bench-init", ttl_attr="expires_at")
    # The end-to-end Powertools function's (bench/rie_bench.py; the layer's function uses bench-layer).
    create_table(client, E2E_POWERTOOLS_TABLE, ttl_attr="expiration")
    return tables


METRICS_SYSTEMS = ("layer", "layer+emf")


def _metrics_cost(endpoint: str, tables: dict[str, str], iterations: int, warmup: int, log_path: Path,
                  progress: Any = print) -> dict[str, Any]:
    """The layer's CPU per invocation with IDEMPOTENCY_METRICS=emf (one EMF document written per invocation, to
    the worker's stdout, a file) and without, on first runs and replays: the two workers interleaved in batches
    of 10 by bench/inprocess.py's `interleave`. Medians, and their ratio."""
    from inprocess import Path_, interleave, started
    from stats import median_ms

    paths = (Path_("first", "metrics", systems=METRICS_SYSTEMS), Path_("replay", "metrics", systems=METRICS_SYSTEMS))
    batch = 10
    with started(METRICS_SYSTEMS, tables, endpoint, log_path) as workers:
        samples = interleave(workers, paths, iterations, warmup, lambda m: progress(f"  metrics cost,{m[1:]}"), batch)
    warmup = -(-warmup // batch) * batch
    # The emf worker's documents went to the log (its stdout): one an invocation, or the figure means nothing.
    with open(log_path, errors="replace") as log:
        written = sum('"_aws"' in line for line in log)
    expected = len(paths) * (warmup + iterations)
    if written != expected:
        raise RuntimeError(f"the layer+emf worker wrote {written} EMF documents for {expected} invocations")
    rows: dict[str, Any] = {}
    for name, systems in samples.items():
        off, on = (median_ms(systems[s].cpu_ns) for s in METRICS_SYSTEMS)
        rows[name] = {"cpu_p50_ms_off": off, "cpu_p50_ms_emf": on, "ratio": on / off if off else float("nan"),
                      "added_us": (on - off) * 1000, "n": len(systems["layer"].cpu_ns),
                      "wrong_results": sum(s.wrong for s in systems.values())}
    return rows


def _render_metrics_cost(rows: dict[str, Any]) -> str:
    lines = [[name, f"{row['cpu_p50_ms_off']:.3f}", f"{row['cpu_p50_ms_emf']:.3f}", f"{row['ratio']:.3f}",
              f"{row['added_us']:.0f}"] for name, row in rows.items()]
    return ("\nWhat metrics cost: the layer's CPU per invocation, IDEMPOTENCY_METRICS=emf over off (medians, "
            "in-process, interleaved)\n"
            + table(["path", "CPU ms off", "CPU ms emf", "ratio", "added us"], lines, True))


def _dynamodb(work: Any, extra: tuple[str, ...] = ()) -> Any:
    """`work(endpoint, tables, log)` against a fresh DynamoDB Local behind the counting proxy."""
    with tempfile.TemporaryDirectory(prefix="idempotency-bench-") as tmp:
        ddb = DynamoDBLocal(Path(tmp) / "dynamodb.log").start()
        proxy = CountingProxy("127.0.0.1", ddb.port)
        log = Path(tmp) / "bench.log"
        try:
            return work(proxy.endpoint, _tables(ddb.endpoint, extra), log)
        except Exception:
            if log.exists():
                print(log.read_text(errors="replace")[-5000:], file=sys.stderr)
            raise
        finally:
            proxy.close()
            ddb.stop()


def _only_metrics_cost(iterations: int, warmup: int) -> int:
    rows = _dynamodb(lambda endpoint, tables, log: _metrics_cost(
        endpoint, tables, iterations, warmup, log, lambda m: print(m, file=sys.stderr)))
    print(_render_metrics_cost(rows))
    print(json.dumps(rows, indent=1))
    return 0


def _only_floor(iterations: int, warmup: int) -> int:
    import floor

    rows = _dynamodb(lambda endpoint, tables, log: floor.measure(
        endpoint, tables, iterations, warmup, log, lambda m: print(m, file=sys.stderr), warm=500))
    print(json.dumps(rows, indent=1), file=sys.stderr)
    print(floor.render(rows))
    return 0


def _only_profile() -> int:
    import profile_hot

    found = _dynamodb(lambda endpoint, tables, log: profile_hot.profile(endpoint, tables, log.parent))
    print(report.render_in_place(found))
    return 0


def _ab(revision: str, iterations: int, warmup: int) -> int:
    import floor

    rows = _dynamodb(lambda endpoint, tables, log: floor.ab(
        endpoint, tables, revision, iterations, warmup, log, lambda m: print(m, file=sys.stderr)),
        extra=("layer@base", "layer+token@base"))
    print(json.dumps(rows, indent=1), file=sys.stderr)
    print(floor.render_ab(revision, rows))
    return 0


def _only_valkey(iterations: int, warmup: int, init_samples: int) -> int:
    import valkey_bench

    with tempfile.TemporaryDirectory(prefix="idempotency-bench-") as tmp:
        result = valkey_bench.measure(iterations, warmup, init_samples, Path(tmp) / "bench.log")
    print(json.dumps(result, indent=1), file=sys.stderr)
    print(valkey_bench.render(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few iterations, few init samples")
    parser.add_argument("--iterations", type=int, help="measured invocations per path and system (default 300)")
    parser.add_argument("--no-e2e", action="store_true", help="skip the Runtime Interface Emulator part")
    parser.add_argument("--no-init", action="store_true", help="skip the init part")
    parser.add_argument("--no-profile", action="store_true", help="skip profiling the layer's hot path")
    parser.add_argument("--only-metrics-cost", action="store_true",
                        help="measure only what IDEMPOTENCY_METRICS=emf costs per invocation, print it, write nothing")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor's rows (plain http.client)")
    parser.add_argument("--only-floor", action="store_true", help="run only the floor's rows, print them, write "
                        "nothing")
    parser.add_argument("--only-profile", action="store_true", help="run only the profile of the layer's hot path "
                        "and print where its CPU goes, timed in place; write nothing")
    parser.add_argument("--ab", metavar="REV", help="run only an A/B of the layer's CPU per invocation: this tree "
                        "against git revision REV (or, with REV..OTHER, revision OTHER against REV), interleaved "
                        "(default 4000 invocations per path); write nothing")
    parser.add_argument("--no-valkey", action="store_true", help="skip the Valkey store's rows")
    parser.add_argument("--only-valkey", action="store_true", help="run only the Valkey store's rows")
    parser.add_argument("--no-large", action="store_true", help="skip the large results' rows")
    parser.add_argument("--only-large", action="store_true", help="run only the large results' rows")
    parser.add_argument("--out", type=Path, help="where results.json, ratios.png and README-section.md (the "
                        "benchmark section of docs/performance.md) go (default: bench/, or a temporary folder with "
                        "--quick, so a smoke run never replaces them)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="idempotency-bench-quick-")) if args.quick else BENCH
    iterations = args.iterations or (30 if args.quick else 300)
    warmup = 10 if args.quick else 30
    init_samples = 3 if args.quick else 16
    e2e_iterations = 20 if args.quick else 150
    if args.ab:
        return _ab(args.ab, args.iterations or 4000, warmup)
    if args.only_profile:
        return _only_profile()
    if args.only_floor:
        return _only_floor(iterations, warmup)
    if args.only_metrics_cost:
        return _only_metrics_cost(iterations, warmup)
    if args.only_valkey:
        return _only_valkey(iterations, warmup, init_samples)
    if args.only_large:
        import large_bench

        return large_bench.main(["--iterations", str(min(iterations, 40))])

    started = time.monotonic()
    meta = report.machine()
    meta.update(iterations=iterations, warmup=warmup, init_samples=init_samples, e2e_iterations=e2e_iterations,
                quick=args.quick, sqs_batch=SQS_BATCH)
    results: dict = {"meta": meta}
    with tempfile.TemporaryDirectory(prefix="idempotency-bench-") as tmp:
        log = Path(tmp) / "bench.log"
        print(f"==> DynamoDB Local and the counting proxy (logs: {log})", file=sys.stderr)
        ddb = DynamoDBLocal(Path(tmp) / "dynamodb.log").start()
        proxy = CountingProxy("127.0.0.1", ddb.port)
        try:
            tables = _tables(ddb.endpoint)
            print(f"==> in-process: {iterations} invocations per path and system after {warmup} warm-up",
                  file=sys.stderr)
            results["inprocess"] = inprocess.measure(
                proxy, tables, iterations, warmup, 10, log, progress=lambda m: print(m, file=sys.stderr)
            )
            print("==> what metrics cost", file=sys.stderr)
            results["metrics_cost"] = _metrics_cost(proxy.endpoint, tables, iterations, warmup, log,
                                                    lambda m: print(m, file=sys.stderr))
            if not args.no_floor:
                import floor

                print("==> the floor: plain http.client sending the layer's own requests", file=sys.stderr)
                results["floor"] = floor.measure(proxy.endpoint, tables, max(iterations, 1000), warmup, log,
                                                 lambda m: print(m, file=sys.stderr))
            if not args.no_init:
                import initbench

                print(f"==> init: {init_samples} fresh processes per system", file=sys.stderr)
                # The https rows go through a TLS forwarder straight to DynamoDB Local (one hop, as the proxy).
                results["init"] = initbench.measure(init_samples, proxy.endpoint, Path(tmp),
                                                    tls_upstream=("127.0.0.1", ddb.port))
                for variant, row in results["init"].get("tls", {}).get("rows", {}).items():
                    # capath: the shipped certificate directory; cafile: the whole bundle loaded (dynamodb/trust.py)
                    print(f"==> init {variant}: CA bundle trusted by {row['transport'].get('trust') or '-'}",
                          file=sys.stderr)
            if not args.no_e2e:
                import rie_bench

                print(f"==> end to end under the Runtime Interface Emulator: {e2e_iterations} per path",
                      file=sys.stderr)
                results["e2e"] = rie_bench.measure(e2e_iterations, proxy, ddb.endpoint, Path(tmp))
            if not (args.no_profile or args.quick):
                import profile_hot

                results["profile"] = profile_hot.profile(proxy.endpoint, tables, Path(tmp))
        except Exception:
            if log.exists():
                print(log.read_text()[-5000:], file=sys.stderr)
            raise
        finally:
            proxy.close()
            ddb.stop()
        if not args.no_valkey:
            import valkey_bench

            print("==> the Valkey store against Powertools' CachePersistenceLayer", file=sys.stderr)
            results["valkey"] = valkey_bench.measure(iterations, warmup, init_samples, log)
        if not args.no_large:
            import large_bench

            print("==> a result kept in S3 against a small one", file=sys.stderr)
            results["large"] = large_bench.measure(min(iterations, 40))
    meta["seconds"] = round(time.monotonic() - started, 1)
    summary = report.summarise(results)
    summary["metrics_cost"] = results["metrics_cost"]
    print(report.render(summary))
    print(_render_metrics_cost(results["metrics_cost"]))
    if "valkey" in results:
        import valkey_bench

        summary["valkey"] = results["valkey"]
        print(valkey_bench.render(results["valkey"]))
    if "large" in results:
        import large_bench

        summary["large"] = results["large"]
        print(large_bench.render(results["large"]))
    report.write(summary, args.out)
    print(f"\nwrote results.json, ratios.png and README-section.md to {args.out} in {meta['seconds']} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
