"""Figures, ratios, targets: from the raw samples to the stdout table, results.json and ratios.png."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from stats import mean_ms, median_ms, percentile_ms, ratio
from tables import table

PACKAGES = ("boto3", "botocore", "orjson", "aws-lambda-powertools", "urllib3", "jmespath", "awslambdaric",
            "matplotlib")
# Which system is "this layer" and which is Powertools, per path (cache hits need the cache-on workers).
PAIRS = {"cache_hit": ("layer+cache", "powertools+cache"), "sqs_new": ("layer-sqs", "powertools-sqs"),
         "sqs_dup": ("layer-sqs", "powertools-sqs"), "kafka_new": ("layer-kafka", "powertools-kafka"),
         "kafka_dup": ("layer-kafka", "powertools-kafka")}
# Rows that show another layer system of a measured path against the same Powertools figures: row -> (measured
# path, layer system). The measured path's own row leaves that system out, so no system is shown twice.
VIEWS = {"kafka_new_always": ("kafka_new", "layer-kafka-always"),
         "kafka_dup_always": ("kafka_dup", "layer-kafka-always")}
PATH_LABELS = {
    "first": "first execution",
    "replay": "replay",
    "cache_hit": "replay, local cache hit",
    "no_key": "no key (pass-through)",
    "first_1k": "first execution, 1 KB result",
    "replay_1k": "replay, 1 KB result",
    "first_100k": "first execution, 100 KB result",
    "replay_100k": "replay, 100 KB result",
    "sqs_new": "SQS batch of 10, new",
    "sqs_dup": "SQS batch of 10, redelivered",
    "kafka_new": "Kafka batch of 10, new",
    "kafka_new_always": "Kafka batch of 10, new, PRECHECK=always",
    "kafka_dup": "Kafka batch of 10, redelivered",
    "kafka_dup_always": "Kafka batch of 10, redelivered, PRECHECK=always",
}
# A batch of 10, new: 2 requests a record. An SQS batch redelivered: one BatchGetItem answers all 10 (the
# pre-check, auto, sees ApproximateReceiveCount > 1). Kafka shows no redelivery, so under auto a redelivered batch
# costs a claim a record (each answering "done"); under IDEMPOTENCY_BATCH_PRECHECK=always every batch is read
# first: one BatchGetItem more on a new batch, the only request on a redelivered one.
EXPECTED_REQUESTS = {"first": 2, "replay": 1, "cache_hit": 1, "no_key": 0, "sqs_new": 20, "sqs_dup": 1,
                     "kafka_new": 20, "kafka_dup": 10, "kafka_new_always": 21, "kafka_dup_always": 1}
MB = 1024 * 1024


def _cpu_model() -> str:
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    model = fields.get("model name", platform.machine())
    if "cpu family" in fields:
        model += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    return model


def machine() -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    hypervisor = ""
    try:
        with open("/proc/cpuinfo") as f:
            hypervisor = " (virtual machine)" if " hypervisor" in f.read() else ""
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model() + hypervisor,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": versions,
    }


# -- summarising ------------------------------------------------------------------------------------------


def _figures(samples: Any) -> dict[str, Any]:
    n = samples.n
    return {
        "n": n,
        "wall_p50_ms": median_ms(samples.wall_ns),
        "wall_p95_ms": percentile_ms(samples.wall_ns, 95),
        "cpu_p50_ms": median_ms(samples.cpu_ns),
        "cpu_mean_ms": mean_ms(samples.cpu_ns),
        "requests": sum(samples.requests.values()) / n if n else math.nan,
        "requests_by_op": {op: count / n for op, count in sorted(samples.requests.items())},
        "bytes_sent": samples.bytes_sent / n if n else math.nan,
        "handler_runs": samples.runs / n if n else math.nan,
        "wrong_results": samples.wrong,
    }


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {"meta": results["meta"], "paths": {}, "targets": []}
    for measured, systems in results["inprocess"].items():
        every = {system: _figures(samples) for system, samples in systems.items()}
        _, powertools = PAIRS.get(measured, ("layer", "powertools"))
        views = {row: mine for row, (source, mine) in VIEWS.items() if source == measured and mine in every}
        rows = {measured: PAIRS.get(measured, ("layer", "powertools"))[0], **views}
        for path, layer in rows.items():
            shown = layer if path in views else None
            figures = {s: f for s, f in every.items() if s in (shown, powertools) or (
                shown is None and s not in views.values())}
            ratios: dict[str, dict[str, float]] = {}
            for mine in (layer, "layer-boto3"):
                if mine in figures and powertools in figures:
                    a, b = figures[mine], figures[powertools]
                    ratios[mine] = {k: ratio(a[k], b[k]) for k in ("wall_p50_ms", "wall_p95_ms", "cpu_p50_ms",
                                                                   "requests", "bytes_sent")}
            summary["paths"][path] = {"label": PATH_LABELS[path], "systems": figures, "ratios": ratios,
                                      "layer": layer, "powertools": powertools, "measured": measured}
    for name in ("init", "e2e", "profile", "floor"):
        if name in results:
            summary[name] = results[name]
    summary["targets"] = targets(summary)
    return summary


def _target(name: str, measured: float, limit: float, unit: str, detail: str = "", exact: bool = False) -> dict:
    if math.isnan(measured):
        verdict = "n/a"
    elif exact:
        verdict = "PASS" if abs(measured - limit) < 1e-9 else "MISS"
    else:
        verdict = "PASS" if measured <= limit else "MISS"
    return {"target": name, "measured": measured, "limit": limit, "unit": unit, "verdict": verdict,
            "detail": detail}


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    paths = summary["paths"]
    found = []
    for path in ("first", "replay"):
        entry = paths[path]
        mine, theirs = entry["systems"][entry["layer"]], entry["systems"][entry["powertools"]]
        found.append(_target(
            f"client CPU per {PATH_LABELS[path]} <= 0.5x Powertools", ratio(mine["cpu_p50_ms"], theirs["cpu_p50_ms"]),
            0.5, "x", f"{mine['cpu_p50_ms']:.3f} ms vs {theirs['cpu_p50_ms']:.3f} ms (medians)"))
    for path, row in (summary.get("floor") or {}).items():  # bench/floor.py: plain http.client, the same requests
        cpu = row["cpu_p50_ms"]
        found.append(_target(
            f"client CPU per {PATH_LABELS[path]} <= 1.3x the floor (plain http.client)", row["layer_over_floor"],
            1.3, "x", f"{cpu['layer']:.3f} ms vs {cpu['floor']:.3f} ms (medians); with a session token "
            f"{row['layer_over_floor_token']:.2f}x, {cpu['layer+token']:.3f} vs {cpu['floor+token']:.3f} ms"))
    e2e = summary.get("e2e")
    if e2e and not e2e.get("skipped"):
        added = e2e_added(e2e)
        by = {(r["label"], r["function"]): r for r in e2e["rows"]}
        for path in ("first", "replay"):
            label = PATH_LABELS[path]
            mine, theirs = added.get(label, {}).get("with layer"), added.get(label, {}).get("powertools")
            if not (mine and theirs):
                continue
            a, b = mine["runtime_cpu_ms"], theirs["runtime_cpu_ms"]
            found.append(_target(
                f"end to end client CPU per {label} <= 0.4x Powertools", ratio(a, b), 0.4, "x",
                f"runtime CPU added over the function without either under RIE: {a:.3f} ms vs {b:.3f} ms "
                f"(means, {_e2e_cpu(e2e)}); requests {by[(label, 'with layer')]['requests']:g} vs "
                f"{by[(label, 'powertools')]['requests']:g}"))
    # A cache hit reads the record (no result) before it replays from memory: it must cost no more than a replay.
    hit = paths["cache_hit"]["systems"]["layer+cache"]
    replay = paths["replay"]["systems"][paths["replay"]["layer"]]
    found.append(_target("cache-hit replay CPU <= 1.0x the replay's", ratio(hit["cpu_p50_ms"], replay["cpu_p50_ms"]),
                         1.0, "x", f"medians {hit['cpu_p50_ms']:.4f} ms vs {replay['cpu_p50_ms']:.4f} ms"))
    for path, expected in EXPECTED_REQUESTS.items():
        entry = paths[path]
        got = entry["systems"][entry["layer"]]["requests"]
        ops = ", ".join(f"{op} {count:g}" for op, count in entry["systems"][entry["layer"]]["requests_by_op"].items())
        found.append(_target(f"requests per {PATH_LABELS[path]} = {expected}", got, expected, "requests",
                             ops or "none", exact=True))
    init = summary.get("init")
    if init:
        cpu = init["overhead_cpu_ms"]
        over, theirs = init["overhead_ms"]["layer"], init["overhead_ms"]["powertools"]
        detail = (f"{over:.1f} ms vs {theirs:.1f} ms over bare (wall medians; Powertools with its .pyc); by CPU "
                  f"{cpu['layer']:.1f} vs {cpu['powertools']:.1f} ms, {ratio(cpu['layer'], cpu['powertools']):.2f}x")
        found.append(_target("init overhead <= 40 ms (import + client + table check)", over, 40.0, "ms", detail))
        found.append(_target("init overhead <= 0.2x Powertools' (import + persistence layer)",
                             ratio(over, theirs), 0.2, "x", detail))
        found.append(_target("added peak RSS <= 8 MB", init["added_rss_mb"]["layer"], 8.0, "MB",
                             f"Powertools adds {init['added_rss_mb']['powertools']:.1f} MB"))
        with_boto3 = init.get("with_boto3")
        if with_boto3:
            ours, pt = with_boto3["layer"], with_boto3["powertools"]
            found.append(_target(
                "init overhead, handler that imports boto3 (informational, <= 40 ms)", ours["over_ms"], 40.0, "ms",
                f"Powertools adds {pt['over_ms']:.1f} ms; RSS +{ours['added_rss_mb']:.1f} MB vs "
                f"+{pt['added_rss_mb']:.1f} MB over a bare handler that imports boto3"))
    return found


E2E_FUNCTIONS = {"with layer": "the layer", "powertools": "Powertools"}  # e2e function -> who it adds


def e2e_added(e2e: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Per path, per function: its median wall and runtime CPU minus the function without layer's."""
    by = {(r["label"], r["function"]): r for r in e2e.get("rows", [])}
    added: dict[str, dict[str, dict[str, float]]] = {}
    for label in dict.fromkeys(r["label"] for r in e2e.get("rows", [])):
        bare = by.get((label, "without layer"))
        for function in E2E_FUNCTIONS:
            mine = by.get((label, function))
            if mine and bare:
                added.setdefault(label, {})[function] = {k: mine[k] - bare[k] for k in ("wall_p50_ms",
                                                                                           "runtime_cpu_ms")}
    return added


def _e2e_cpu(e2e: dict[str, Any]) -> str:
    return "schedstat" if e2e.get("cpu_source", "ticks") == "schedstat" else "utime + stime ticks"


# -- rendering --------------------------------------------------------------------------------------------


def _fmt(value: float, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _ratio_cell(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}x"


def render_in_place(profile: dict[str, Any], markdown: bool = False) -> str:
    """bench/profile_hot.py's parts timed in place: a row a part, a column a path."""
    found = profile["in_place"]
    names = list(found)
    rows = [[row["part"], *(_fmt(found[name][i]["us"], 1) for name in names)]
            for i, row in enumerate(found[names[0]])]
    return ("\nWhere the layer's CPU goes, timed in place (CPU us per invocation, each part wrapped in a timer while "
            "real invocations run; bench/profile_hot.py)\n" + table(["part", *names], rows, markdown))


def render(summary: dict[str, Any], markdown: bool = False, cprofile: bool = True) -> str:
    meta = summary["meta"]
    parts = []
    versions = ", ".join(f"{k} {v}" for k, v in meta["packages"].items() if v)
    parts.append(f"{meta['date']}; {meta['cpu']}, {meta['cores']} cores; Python {meta['python']}; {versions}")
    parts.append(f"{meta['iterations']} measured invocations per path and system after {meta['warmup']} warm-up, "
                 "systems interleaved in batches of 10; medians unless p95"
                 + (f"; a batch row's (SQS, Kafka) invocation is one batch of {meta['sqs_batch']} records, its "
                    "figures per batch" if meta.get("sqs_batch") else ""))

    # 1. Headline: this layer (lean transport) against Powertools, per path, with ratio columns.
    header = ["path", "CPU ms layer", "CPU ms PT", "CPU ratio", "wall p50 layer", "wall p50 PT", "wall ratio",
              "p95 ratio", "requests layer", "requests PT", "bytes layer", "bytes PT", "bytes ratio"]
    rows = []
    for entry in summary["paths"].values():
        a, b = entry["systems"][entry["layer"]], entry["systems"][entry["powertools"]]
        r = entry["ratios"][entry["layer"]]
        rows.append([entry["label"], _fmt(a["cpu_p50_ms"]), _fmt(b["cpu_p50_ms"]), _ratio_cell(r["cpu_p50_ms"]),
                     _fmt(a["wall_p50_ms"]), _fmt(b["wall_p50_ms"]), _ratio_cell(r["wall_p50_ms"]),
                     _ratio_cell(r["wall_p95_ms"]), _fmt(a["requests"], 2), _fmt(b["requests"], 2),
                     _fmt(a["bytes_sent"], 0), _fmt(b["bytes_sent"], 0), _ratio_cell(r["bytes_sent"])])
    parts.append("\nThis layer (lean transport) / Powertools @idempotent, in-process, per invocation (SQS rows: "
                 "layer-sqs / powertools-sqs, Kafka rows: layer-kafka or layer-kafka-always / powertools-kafka, "
                 "per batch)")
    parts.append(table(header, rows, markdown))

    # 2. Every system, every figure.
    header = ["path", "system", "wall p50 ms", "wall p95 ms", "CPU p50 ms", "CPU mean ms", "requests", "bytes sent",
              "handler runs", "CPU / PT"]
    rows, listed = [], set()
    for path, entry in summary["paths"].items():
        pt = entry["systems"][entry["powertools"]]["cpu_p50_ms"]
        for system, f in entry["systems"].items():
            if (entry.get("measured", path), system) in listed:  # Powertools under a view row: listed above
                continue
            listed.add((entry.get("measured", path), system))
            ops = "+".join(f"{op.replace('Item', '')}" for op in f["requests_by_op"]) or "-"
            rows.append([entry["label"], system, _fmt(f["wall_p50_ms"]), _fmt(f["wall_p95_ms"]),
                         _fmt(f["cpu_p50_ms"]), _fmt(f["cpu_mean_ms"]), f"{_fmt(f['requests'], 2)} ({ops})",
                         _fmt(f["bytes_sent"], 0), _fmt(f["handler_runs"], 2), _ratio_cell(ratio(f["cpu_p50_ms"], pt))])
    parts.append("\nAll systems (bare = the handler alone; layer-boto3 = IDEMPOTENCY_TRANSPORT=boto3; batch rows: "
                 "handler runs = records whose work ran, per batch)")
    parts.append(table(header, rows, markdown))
    wrong = [(p, s) for p, e in summary["paths"].items() for s, f in e["systems"].items() if f["wrong_results"]]
    if wrong:
        parts.append(f"WARNING: results differing from the handler's: {wrong}")

    init = summary.get("init")
    if init:
        parts.append(f"\nInit, fresh process to ready for the first event ({init['samples']} each, medians; "
                     f"{init['note']})")
        header = ["system", "wall ms", "over bare ms", "CPU ms", "CPU over bare ms", "peak RSS MB", "added RSS MB",
                  "overhead / PT"]
        rows = []
        for system, f in init["systems"].items():
            over_tls = system.endswith(("https", "test CA only"))
            theirs = init["overhead_ms"]["powertools, https" if over_tls and "powertools, https" in init["overhead_ms"]
                                         else "powertools"]
            over = init["overhead_ms"].get(system, math.nan)
            rows.append([system, _fmt(f["wall_ms"], 1), _fmt(over, 1), _fmt(f["cpu_ms"], 1),
                         _fmt(init["overhead_cpu_ms"].get(system, math.nan), 1), _fmt(f["hwm_mb"], 1),
                         _fmt(init["added_rss_mb"].get(system, math.nan), 1), _ratio_cell(ratio(over, theirs))])
        parts.append(table(header, rows, markdown))
        tls = init.get("tls")
        if tls:
            parts.append(f"\nInit over TLS: {tls['endpoint']} is a TLS-terminating forwarder on loopback in front of "
                         "DynamoDB Local (throwaway CA and server certificate, RSA 2048); AWS_CA_BUNDLE = "
                         f"{_bundle_name(tls)} ({tls['default_bundle_certs']} certificates, what the layer "
                         "loads on its own) + that CA, or that CA alone; https rows over `bare, https`, http rows "
                         "over `bare` (medians, as above)")
            header = ["system", "endpoint", "over bare ms", "CPU over bare ms", "added RSS MB", "TLS adds ms",
                      "TLS adds CPU ms", "TLS adds MB", "layer's transport"]
            rows, shown = [], set()
            for variant, t in tls["rows"].items():
                if t["http"] not in shown:  # each http row once, above its https rows
                    shown.add(t["http"])
                    rows.append([t["http"], "http", _fmt(t["http_over_ms"], 1), _fmt(t["http_over_cpu_ms"], 1),
                                 _fmt(t["http_added_rss_mb"], 1), "", "", "", ""])
                found = t["transport"]
                how = "-" if found["name"] == "-" else (
                    f"{found['name']}" + (", TLS at init" if found["tls"] else ", no TLS at init"))
                kind = " (test CA only)" if variant.endswith("test CA only") else ""
                rows.append([t["http"], "https" + kind,
                             _fmt(t["over_ms"], 1), _fmt(t["over_cpu_ms"], 1), _fmt(t["added_rss_mb"], 1),
                             _fmt(t["tls_adds_ms"], 1), _fmt(t["tls_adds_cpu_ms"], 1), _fmt(t["tls_adds_rss_mb"], 1),
                             how])
            parts.append(table(header, rows, markdown))
        parts.append("\nPeak RSS of the layer's init, step by step (one process; each step's own megabytes)")
        parts.append(table(["step", "peak RSS MB", "added MB"],
                            [[r["step"], _fmt(r["hwm_mb"], 1), _fmt(r["added_mb"], 1)] for r in init["rss_steps"]],
                            markdown))
        parts.append("\n`python -X importtime` of idempotency_layer.interceptor (the layer with its .pyc), "
                     "top 10 cumulative")
        parts.append(table(["module", "cumulative ms", "self ms"],
                            [[m["module"], _fmt(m["cumulative_ms"], 1), _fmt(m["self_ms"], 1)]
                             for m in init["importtime"]], markdown))

    e2e = summary.get("e2e")
    if e2e:
        if e2e.get("skipped"):
            parts.append(f"\nEnd to end under RIE: skipped ({e2e['skipped']})")
        else:
            parts.append(f"\nEnd to end under the Runtime Interface Emulator ({e2e['note']}; "
                         + ", ".join(f"{k} {v}" for k, v in e2e["runtime"].items()) + ")")
            cpu = "runtime CPU ms / invocation (" + _e2e_cpu(e2e) + ")"
            header = ["path", "function", "wall p50 ms", "wall p95 ms", cpu, "requests"]
            rows = []
            for p in e2e["rows"]:
                requests = _fmt(p["requests"], 2)
                if "requests_by_op" in p:  # not in results.json files from before it was recorded
                    requests += " (" + ("+".join(op.replace("Item", "") for op in p["requests_by_op"]) or "-") + ")"
                rows.append([p["label"], p["function"], _fmt(p["wall_p50_ms"]), _fmt(p["wall_p95_ms"]),
                             _fmt(p["runtime_cpu_ms"], 3), requests])
            for label, added in e2e_added(e2e).items():
                for function, who in E2E_FUNCTIONS.items():
                    if function in added:
                        rows.append([label, f"added by {who}", _fmt(added[function]["wall_p50_ms"]), "",
                                     _fmt(added[function]["runtime_cpu_ms"], 3), ""])
                if len(added) == len(E2E_FUNCTIONS):
                    rows.append([label, "layer / Powertools, added",
                                 _ratio_cell(ratio(added["with layer"]["wall_p50_ms"],
                                                   added["powertools"]["wall_p50_ms"])), "",
                                 _ratio_cell(ratio(added["with layer"]["runtime_cpu_ms"],
                                                   added["powertools"]["runtime_cpu_ms"])), ""])
            parts.append(table(header, rows, markdown))

    if summary.get("floor"):
        import floor

        parts.append(floor.render(summary["floor"]))
    profile = summary.get("profile")
    if profile:
        parts.append(render_in_place(profile, markdown))
        parts.append("\nThe layer's hot-path parts timed alone, warm, no profiler (CPU ms per call, best of 5 means)")
        parts.append(table(["part", "CPU ms"], [[c["part"], _fmt(c["ms"], 4)] for c in profile["components"]],
                            markdown))
        for name, found in (profile["cprofile"] if cprofile else {}).items():
            parts.append(f"\ncProfile (timer time.process_time) of the layer's {name}, lean transport, per "
                         "invocation (profiler overhead included)")
            parts.append(table(["function, by own time", "calls", "own ms", "cumulative ms"],
                                [[t["function"], str(t["calls"]), _fmt(t["own_ms"], 4), _fmt(t["cum_ms"], 4)]
                                 for t in found["top"]], markdown))

    parts.append("\nTargets (this layer, ratios within this run)")
    rows = [[t["target"], _fmt(t["measured"], 3) + (" " + t["unit"] if t["unit"] != "x" else "x"),
             t["verdict"], t["detail"]] for t in summary["targets"]]
    parts.append(table(["target", "measured", "verdict", "detail"], rows, markdown))
    return "\n".join(parts)


# -- the benchmark section of docs/performance.md (written to bench/README-section.md) -----------------

NOTES = """\
How it was measured, and where the systems differ:

- One DynamoDB Local (in memory) behind one counting proxy; every system is pointed at the proxy, which counts
  requests by `X-Amz-Target` and the bytes clients send. The proxy is the tests' `CountingProxy`, which
  sets TCP_NODELAY on both legs: without it, requests written as headers then body wait for
  delayed ACKs and every wall time carries ~40 ms of the proxy's.
- One worker process per system, configured once as at a function's init, fed the same events; batches of 10
  invocations go to each system in turn, the order rotated per batch, only one process working at a time.
  CPU is `time.process_time()` around the handler call (user + kernel of the worker, socket I/O included;
  DynamoDB Local's and the proxy's are not).
- Equivalent settings: key expression `orderId`, TTL 3600 s, key prefix `bench`, local cache off except on the
  cache row (1024 entries each), `raise_on_no_idempotency_key=False` / `IDEMPOTENCY_REQUIRE_KEY=false`. Each
  library keeps its own record layout, in a table of its own, and its own defaults otherwise: Powertools hashes
  with md5 over `json.dumps`, deep-copies the event, stores results as uncompressed JSON; this layer hashes
  with sha256 over orjson and zlib-compresses results over 8 KB (the 100 KB result is stored as ~19 KB, hence
  its bytes ratio). Bytes count what clients send, not what they receive.
- `layer` is the default lean transport with its target read from the environment (the bench's environment is
  the plain Lambda one, with the endpoint pointed at the proxy); `layer-botocore` (init rows) is the same client
  with its target from botocore, as with a non-empty AWS config file; `layer-boto3` is
  `IDEMPOTENCY_TRANSPORT=boto3`, the same boto3 client Powertools uses. The "handler imports boto3" init rows run
  a handler module that imports boto3 and builds a DynamoDB client at import, bare, under the layer and with
  Powertools.
- SQS rows: one invocation is one batch of 10 messages built by `tests/support/events.py` as Lambda sends
  them (bodies are the small rows' orders); "redelivered" is the same 10 messages again, same messageIds and
  new receipt handles. `layer-sqs` is the layer's defaults (no key expression, no `IDEMPOTENCY_SCOPE`: an SQS
  batch runs per record, keyed by messageId, lean transport) around `bench_handler.consumer`, which processes
  each record of `event["Records"]`. `powertools-sqs` is Powertools' documented batch + idempotency code:
  `BatchProcessor(EventType.SQS)` and `process_partial_response` around a record handler decorated with
  `idempotent_function(data_keyword_argument="record")`, `IdempotencyConfig(event_key_jmespath="messageId")`,
  same TTL, prefix and table layout as its other rows; its record handler calls the consumer's per-record work
  and returns None. The layer claims a batch's records concurrently (up to 10 requests in flight) and calls the
  consumer once; Powertools runs its records one after another. A redelivered batch's messages carry an
  `ApproximateReceiveCount` of 2, so the layer reads all 10 in one `BatchGetItem` (IDEMPOTENCY_BATCH_PRECHECK's
  default, `auto`) where Powertools makes one request a record. Figures are per batch (CPU includes the
  layer's worker threads). After every batch each message's work must have run exactly once (counted by the
  work itself), else the bench stops.
- Kafka rows: one invocation is one Amazon MSK (`aws:kafka`) batch of 10 records over 2 partitions of one topic,
  built by `tests/support/broker_events.py` as Lambda sends them (values are the small rows' orders, base64);
  "redelivered" is the same records again (same offsets). `layer-kafka` is the layer's defaults (a Kafka batch
  runs per record, keyed by cluster, topic, partition and offset) around the same consumer, which processes each
  record of `event["records"]`; `layer-kafka-always` adds `IDEMPOTENCY_BATCH_PRECHECK=always`. Kafka shows no
  redelivery, so under the default (`auto`) a redelivered batch costs a claim a record, each answering that the
  record is done; under `always` every batch is read first with one `BatchGetItem`: one request more on a new
  batch, the only request on a redelivered one. `powertools-kafka` is `BatchProcessor(EventType.Kafka)` (which
  Powertools 3.37.0 processes: it flattens `records` and reports failures per partition and offset) with the
  same record handler, `event_key_jmespath="[topic, partition, offset]"`. The `PRECHECK=always` rows show
  `layer-kafka-always` against the same Powertools figures as the default rows. The same exactly-once check.
- In-process there is no runtime to marshal results, so the layer does no marshal check there. Under the
  runtime it marshals a fresh result once with the runtime's own encoder, to refuse what cannot be marshalled,
  and hands the text back as raw JSON, so the runtime does not encode it again: the end-to-end rows measure
  that. Pass-through: the layer logs one WARNING per event (to a
  file here); Powertools calls `warnings.warn`, which Python prints once per call site.
- Init: a fresh process per sample, time from `Popen` to a "ready" line, CPU (`process_time`) and VmHWM at
  that point (wall includes waiting for a core on this shared machine; CPU does not); every probe runs with
  PYTHONDONTWRITEBYTECODE=1. Each starts as a Lambda function does: the runtime's bootstrap
  (`awslambdaric.bootstrap`, which brings json, logging, threading and decimal) is imported before the handler
  module, for every system alike, and the layer's probes run through its exec wrapper (bash), as
  AWS_LAMBDA_EXEC_WRAPPER runs it. `bare, no runtime modules` and `layer, no runtime modules` are the bench's
  earlier measure (plain Python, no wrapper), where what the layer shares with the runtime counts against it.
  The layer's package carries unchecked-hash .pyc for this Python, as the zip ships them for each Python
  3.10-3.14 the build had an interpreter of; `layer (no .pyc)` is a copy without, as for a Python the build
  could not compile for (/opt is read-only, so none can be written at run time).
  boto3/botocore/urllib3/jmespath keep theirs, as the runtime's do.
  Powertools keeps its .pyc: its layers are built per Python version with pip (which compiles), and the layer
  canary in its repository (layer_v3) fails when imports recompile sources; an older version of its layer
  Dockerfile deleted .pyc, so what the 3.37.0 layer ships is not verified here. With .pyc is its better case and
  the harder comparison for this layer; Powertools without .pyc, and this layer without, are shown too.
- Init over TLS: on Lambda the endpoint is https, so the layer's init (whose table check is a request) pays
  `import ssl`, loading its CA bundle and a handshake. `bench/tls.py` makes a throwaway CA and a server
  certificate for 127.0.0.1 (RSA 2048) at run time and runs a TLS-terminating forwarder (asyncio, loopback
  only, a free port, stopped at the end) straight to DynamoDB Local, so an https row has as many hops as an
  http row has through the proxy. Every https row (bare, the layer, Powertools) has AWS_CA_BUNDLE set to the CA
  bundle the layer resolves on its own here (certifi's or botocore's `cacert.pem`; REQUESTS_CA_BUNDLE is
  removed from every init probe's environment, as it is unset on Lambda) with the throwaway CA appended, so it
  loads what it would on Lambda plus one certificate; `test CA only` trusts that CA alone. The probe records
  which transport the layer built and whether its init made a TLS connection. Powertools makes no request at
  init: its TLS cost comes with its first request, which init does not measure.
- End to end: `tests/support/rie.py` (RIE + awslambdaric through the stand-in managed-runtime bootstrap); three
  functions in the same run, each its own environment: the bench handler alone, under this layer (the built
  zip unpacked into a stand-in /opt, attached with AWS_LAMBDA_EXEC_WRAPPER), and under Powertools'
  `@idempotent` + `DynamoDBPersistenceLayer` configured as in-process (`bench/powertools_handler.py`, its own
  table, Powertools copied into its task root since the runtime venv lacks it; it uses the runtime's boto3).
  Batches of 10 rotate over them. Runtime CPU is the runtime process's nanoseconds on CPU (the first field of
  /proc/<pid>/task/*/schedstat, summed over its threads) read before and after each batch once the runtime
  is idle again, divided by the invocations (utime + stime ticks only where schedstat is unavailable; kept in
  results.json as a cross-check); "added" is a function's figure minus the bare function's. Requests are
  counted by the proxy per batch.
- The floor (bench/floor.py): plain `http.client` sending the requests the layer wrote for one event, captured
  on its socket, with each event's key and order id put in, and the handler run when the claim is answered 200;
  the floor signs nothing. Its rows run after the in-process part, on the layer, the floor and Powertools
  interleaved, 1,000 invocations per path; ratios are the median of paired batches' ratios. The in-place table
  (bench/profile_hot.py) wraps each part in a CPU timer while real invocations run; the glue is the rest.
- The machine is shared and noisy: ratios within one run are what to read; absolute figures move between runs.
"""


def verdicts(summary: dict[str, Any]) -> str:
    met = [t for t in summary["targets"] if t["verdict"] == "PASS"]
    missed = [t for t in summary["targets"] if t["verdict"] == "MISS"]
    lines = [f"Met ({len(met)} of {len(summary['targets'])}): " + "; ".join(
        f"{t['target']} ({_measured(t)})" for t in met) + "."]
    for t in missed:
        over = t["measured"] - t["limit"]
        how = f"{over:.3g}{'x' if t['unit'] == 'x' else ' ' + t['unit']} over the limit"
        if t["limit"]:
            how += f" ({over / t['limit']:.0%})"
        lines.append(f"Missed: {t['target']}: measured {_measured(t)}, {how}; {t['detail']}.")
    return "\n\n".join(lines)


def _measured(t: dict[str, Any]) -> str:
    if t["unit"] == "x":
        return f"{t['measured']:.3g}x"
    if t["unit"] == "requests":
        return f"{t['measured']:g}: {t['detail']}"
    return f"{t['measured']:.3g} {t['unit']}"


def _bundle_name(tls: dict[str, Any]) -> str:
    """certifi/cacert.pem, botocore/cacert.pem: the bundle's folder says whose it is."""
    path = Path(tls["default_bundle"])
    return f"{path.parent.name}/{path.name}"


def _within(value: float, limit: float, unit: str) -> str:
    return f"within the {limit:g} {unit} target" if value <= limit else f"over the {limit:g} {unit} target"


def prose(summary: dict[str, Any]) -> list[str]:
    """The benchmark section's sentences on end-to-end CPU and init over TLS, from this run's figures."""
    found = []
    e2e = summary.get("e2e")
    if e2e and not e2e.get("skipped"):
        added = e2e_added(e2e)
        by = {(r["label"], r["function"]): r for r in e2e["rows"]}
        bits = []
        for label in ("first execution", "replay"):
            got = added.get(label, {})
            if "with layer" in got and "powertools" in got:
                a, b = got["with layer"]["runtime_cpu_ms"], got["powertools"]["runtime_cpu_ms"]
                bits.append(f"{a:.3f} ms against {b:.3f} ms per {label} ({ratio(a, b):.2f}x; requests "
                            f"{by[(label, 'with layer')]['requests']:g} and {by[(label, 'powertools')]['requests']:g})")
        if bits:
            found.append("End to end under the Runtime Interface Emulator, with Powertools run the same way in the "
                         "same run, the runtime CPU this layer adds over the bare function, against what "
                         f"Powertools adds ({_e2e_cpu(e2e)}, means): " + "; ".join(bits) + ".")
    init = summary.get("init") or {}
    tls = init.get("tls")
    if tls and "layer, https" in tls["rows"]:
        t = tls["rows"]["layer, https"]
        found_transport = t["transport"]
        trusted = found_transport.get("trust", "-")
        path = (f"on the lean client with the environment's target, TLS at init, its CA bundle trusted by {trusted}"
                if found_transport["name"] == "Client(environment)" and found_transport["tls"]
                else f"on {found_transport['name']} (TLS at init: {found_transport['tls']}, trust: {trusted})")
        text = (f"Init over TLS, measured in this run (an https endpoint on loopback: a TLS-terminating forwarder "
                f"in front of DynamoDB Local, AWS_CA_BUNDLE = {_bundle_name(tls)} "
                f"({tls['default_bundle_certs']} certificates, the bundle the layer loads on its own) plus the run's "
                f"throwaway CA): the layer's init costs "
                f"{t['over_ms']:.1f} ms over bare (CPU {t['over_cpu_ms']:.1f} "
                f"ms) and {t['added_rss_mb']:.1f} MB of peak memory, against {t['http_over_ms']:.1f} ms (CPU "
                f"{t['http_over_cpu_ms']:.1f} ms) and {t['http_added_rss_mb']:.1f} MB over http; TLS (`import "
                f"ssl`, loading the bundle, the table check's handshake) adds {t['tls_adds_ms']:.1f} ms, "
                f"{t['tls_adds_cpu_ms']:.1f} ms of CPU and {t['tls_adds_rss_mb']:.1f} MB. The layer stayed {path}.")
        only = tls["rows"].get("layer, https, test CA only")
        if only:
            text += (f" Trusting the throwaway CA alone its https init is {only['over_ms']:.1f} ms over bare (CPU "
                     f"{only['over_cpu_ms']:.1f} ms, {only['added_rss_mb']:.1f} MB): loading the "
                     f"{tls['default_bundle_certs']}-certificate bundle is {t['over_cpu_ms'] - only['over_cpu_ms']:.1f}"
                     " ms of that CPU.")
        pt = tls["rows"].get("powertools, https")
        if pt:
            text += (f" Over https the layer's init is {_within(t['over_ms'], 40.0, 'ms')} (by wall; CPU "
                     f"{t['over_cpu_ms']:.1f} ms), {_within(t['added_rss_mb'], 8.0, 'MB')}, and "
                     f"{ratio(t['over_ms'], pt['over_ms']):.2f}x Powertools' {pt['over_ms']:.1f} ms over bare "
                     f"with the same bundle (by CPU {ratio(t['over_cpu_ms'], pt['over_cpu_ms']):.2f}x); Powertools "
                     "makes no request at init, so its handshake and bundle come with its first request instead.")
        found.append(text)
    return found


def readme_section(summary: dict[str, Any]) -> str:
    """The benchmark section of docs/performance.md, pasted there whole below the page's introduction (the
    file keeps its old name, bench/README-section.md); its links are relative to docs/."""
    meta = summary["meta"]
    sentences = prose(summary)
    return "\n".join([
        "## Benchmark: this layer against Powertools `@idempotent`",
        "",
        f"Measured {meta['date']} by `bench/run.py` (what `./build.sh bench` runs; {meta['seconds']} s) on "
        f"{meta['cpu']}, {meta['cores']} cores, Python {meta['python']}. Raw figures: `bench/results.json`.",
        "",
        "![this layer / Powertools, per path](../bench/ratios.png)",
        "",
        verdicts(summary),
        "",
        *(line for sentence in sentences for line in (sentence, "")),
        "```text",
        render(summary, cprofile=False),
        "```",
        "",
        "cProfile's per-function tables are on the run's stdout and in `bench/results.json` (`profile`).",
        "",
        NOTES,
    ])


# -- files ------------------------------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    # JSON has no NaN: missing figures are null.
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 6)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write(summary: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(_clean(summary), indent=2) + "\n")
    os.replace(tmp, out / "results.json")
    chart(summary, out / "ratios.png")
    (out / "README-section.md").write_text(readme_section(summary))


def chart(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    init = summary.get("init")
    fig, axes = plt.subplots(1, 2 if init else 1, figsize=(13, 5.5), squeeze=False,
                             gridspec_kw={"width_ratios": [4, 1] if init else [1]})
    ax = axes[0][0]
    labels = [e["label"] for e in summary["paths"].values()]
    series = [("CPU p50", "cpu_p50_ms"), ("wall p50", "wall_p50_ms"), ("wall p95", "wall_p95_ms"),
              ("bytes sent", "bytes_sent")]
    width = 0.8 / len(series)
    for i, (name, key) in enumerate(series):
        values = [e["ratios"][e["layer"]][key] for e in summary["paths"].values()]
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        ax.bar(xs, [0 if v is None or math.isnan(v) else v for v in values], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(0.5, color="grey", linewidth=0.8, linestyle="--", label="CPU target (0.5x)")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("this layer / Powertools (lower is better)")
    ax.set_title("per invocation, in-process (a batch row's invocation: one SQS or Kafka batch of 10 records)",
                 fontsize=9)
    ax.legend(fontsize=8)
    if init:
        side = axes[0][1]
        theirs = init["overhead_ms"]["powertools"], init["added_rss_mb"]["powertools"]
        names = ["layer", "layer (no .pyc)"]
        width = 0.35
        for i, (label, key, base) in enumerate((("init time over bare", "overhead_ms", theirs[0]),
                                                 ("added peak RSS", "added_rss_mb", theirs[1]))):
            values = [ratio(init[key][n], base) for n in names]
            side.bar([x + (i - 0.5) * width for x in range(len(names))],
                     [0 if math.isnan(v) else v for v in values], width, label=label, color=f"C{4 + i}")
        side.axhline(1.0, color="black", linewidth=0.8)
        side.axhline(0.2, color="grey", linewidth=0.8, linestyle="--")
        side.set_xticks(range(len(names)))
        side.set_xticklabels(["layer (with its .pyc, as shipped)", "layer without .pyc"], rotation=25, ha="right",
                             fontsize=8)
        side.set_title("init vs Powertools (with .pyc)", fontsize=9)
        side.legend(fontsize=8)
    meta = summary["meta"]
    fig.suptitle(f"idempotency-layer / Powertools @idempotent: {meta['date']}, {meta['cpu']}, {meta['cores']} "
                 f"cores, Python {meta['python']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    # Re-render a results.json: python bench/report.py [results.json] [--markdown]
    # [--readme: rewrite bench/README-section.md, the section to paste into docs/performance.md]
    source = Path(next((a for a in sys.argv[1:] if not a.startswith("--")), Path(__file__).parent / "results.json"))
    loaded = json.loads(source.read_text())
    if "--readme" in sys.argv:
        (source.parent / "README-section.md").write_text(readme_section(loaded))
    else:
        print(render(loaded, "--markdown" in sys.argv))
