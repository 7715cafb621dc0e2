"""The side-by-side benchmark: this layer, Powertools' @idempotent and the bare handler.

    ./build.sh bench            (or .venv/bin/python bench/run.py [--quick] [--no-init] [--no-e2e] [--no-profile])

One run, one DynamoDB Local behind one counting proxy, the same events for every system:
  1. steady state in-process (bench/inprocess.py): wall, CPU, requests and bytes per invocation, per path;
  2. init in fresh processes (bench/initbench.py): time and peak RSS to "ready for the first event", against
     the proxy over http and, through a TLS forwarder on loopback (bench/tls.py), over https;
  3. end to end under the Runtime Interface Emulator (bench/rie_bench.py): the function bare, with the layer and
     with Powertools;
  4. where the layer's hot path spends its CPU (bench/profile_hot.py): parts timed alone, and cProfile.
It reports; it asserts nothing about speed. Output: a table on stdout, bench/results.json, bench/ratios.png and
bench/README-section.md, the benchmark section to paste into docs/performance.md below its introduction.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests.support, after bench/ itself

import inprocess
import report
from common import BENCH, CREDENTIALS, E2E_POWERTOOLS_TABLE, SQS_BATCH, SYSTEMS

from tests.support.counting_proxy import CountingProxy
from tests.support.dynamodb_local import DynamoDBLocal, create_table


def _tables(endpoint: str) -> dict[str, str]:
    import boto3

    client = boto3.client(
        "dynamodb", endpoint_url=endpoint, region_name=CREDENTIALS["AWS_REGION"],
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    tables: dict[str, str] = {}
    for system, (kind, _) in SYSTEMS.items():
        name = "bench-" + system.replace("+", "-")
        if kind != "bare":  # each library's own record layout and TTL attribute, one table per worker
            create_table(client, name, ttl_attr="expiration" if kind == "powertools" else "expires_at")
        tables[system] = name
    # The init probes' table (bench/initbench.py): the layer checks its table's key schema at init.
    create_table(client, "bench-init", ttl_attr="expires_at")
    # The end-to-end Powertools function's (bench/rie_bench.py; the layer's function uses bench-layer).
    create_table(client, E2E_POWERTOOLS_TABLE, ttl_attr="expiration")
    return tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few iterations, few init samples")
    parser.add_argument("--iterations", type=int, help="measured invocations per path and system (default 300)")
    parser.add_argument("--no-e2e", action="store_true", help="skip the Runtime Interface Emulator part")
    parser.add_argument("--no-init", action="store_true", help="skip the init part")
    parser.add_argument("--no-profile", action="store_true", help="skip profiling the layer's hot path")
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
    meta["seconds"] = round(time.monotonic() - started, 1)
    summary = report.summarise(results)
    print(report.render(summary))
    report.write(summary, args.out)
    print(f"\nwrote results.json, ratios.png and README-section.md to {args.out} in {meta['seconds']} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
