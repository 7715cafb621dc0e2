"""The EMF checker's own rules (each broken rule rejected), the documents and lines `metrics` builds, the tally
under threads, the settings, and that metrics off costs nothing: metrics.py is not even imported."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer import config, metrics
from idempotency_layer.errors import IdempotencyConfigurationError
from tests.support import emf

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("IDEMLAYER_PROPERTY_EXAMPLES", "60"))


def _valid() -> dict:
    return {
        "_aws": {"Timestamp": 1764900000000, "CloudWatchMetrics": [{
            "Namespace": "Idempotency", "Dimensions": [["FunctionName", "Source"]],
            "Metrics": [{"Name": "Replays", "Unit": "Count"}, {"Name": "StoreTime", "Unit": "Milliseconds"}],
        }]},
        "FunctionName": "orders", "Source": "event", "Replays": 1, "StoreTime": [1.5, 2.0],
    }


def _line(doc: dict) -> str:
    return json.dumps(doc)


def test_the_checker_accepts_a_valid_document():
    assert emf.check(_line(_valid()))["Replays"] == 1


def _broken(change) -> str:
    doc = _valid()
    change(doc)
    return _line(doc)


def _many_metrics(doc: dict) -> None:
    for i in range(101):
        doc[f"M{i}"] = 1
    doc["_aws"]["CloudWatchMetrics"][0]["Metrics"] = [{"Name": f"M{i}", "Unit": "Count"} for i in range(101)]


def _many_dimensions(doc: dict) -> None:
    names = [f"D{i}" for i in range(31)]
    doc.update({name: "x" for name in names})
    doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] = [names]


BROKEN = {
    "no _aws": lambda d: d.pop("_aws"),
    "no Timestamp": lambda d: d["_aws"].pop("Timestamp"),
    "Timestamp a string": lambda d: d["_aws"].update(Timestamp="2025-12-05T01:00:00Z"),
    "Timestamp in seconds as a float": lambda d: d["_aws"].update(Timestamp=1764900000.5),
    "no CloudWatchMetrics": lambda d: d["_aws"].pop("CloudWatchMetrics"),
    "an unknown _aws member": lambda d: d["_aws"].update(Extra=1),
    "no Namespace": lambda d: d["_aws"]["CloudWatchMetrics"][0].pop("Namespace"),
    "no Dimensions": lambda d: d["_aws"]["CloudWatchMetrics"][0].pop("Dimensions"),
    "a metric without a root member": lambda d: d.pop("Replays"),
    "a metric that is a string": lambda d: d.update(Replays="1"),
    "a metric that is a boolean": lambda d: d.update(Replays=True),
    "a metric array with a string": lambda d: d.update(StoreTime=[1, "2"]),
    "a dimension without a root member": lambda d: d.pop("Source"),
    "a dimension that is a number": lambda d: d.update(Source=3),
    "a blank dimension value": lambda d: d.update(Source=" "),
    "101 metrics": _many_metrics,
    "31 dimensions": _many_dimensions,
    "a bad unit": lambda d: d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0].update(Unit="Counts"),
    "a bad storage resolution": lambda d: d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0].update(StorageResolution=5),
    "a metric defined twice": lambda d: d["_aws"]["CloudWatchMetrics"][0]["Metrics"].append({"Name": "Replays"}),
    "a metric without a Name": lambda d: d["_aws"]["CloudWatchMetrics"][0]["Metrics"].append({"Unit": "Count"}),
}


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_the_checker_rejects_each_broken_rule(rule):
    with pytest.raises(emf.EmfError):
        emf.check(_broken(BROKEN[rule]))


def test_the_checker_rejects_text_that_is_not_one_json_object():
    for text in ("not json", "[1, 2]", '{"_aws": 1}', json.dumps(_valid(), indent=1)):
        with pytest.raises(emf.EmfError):
            emf.check(text)


# -- documents ------------------------------------------------------------------------------------------------


def _tally(kind: str = "event", key: str | None = "orders#ab", records: int = 0, **counts: int) -> metrics.Tally:
    tally = metrics.Tally()
    tally.kind, tally.key, tally.records = kind, key, records
    tally.add_many(**counts)
    return tally


def test_a_first_run_document():
    tally = _tally(FirstExecutions=1)
    tally.stored(0.0042, False)
    tally.stored(0.0031, False)
    doc = emf.check(json.dumps(metrics.document(tally, "Idempotency", "orders", 1764900000123, "req-1")))
    assert doc["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Idempotency"
    assert doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["FunctionName", "Source"]]
    assert (doc["FunctionName"], doc["Source"]) == ("orders", "event")
    assert doc["Invocations"] == 1 and doc["FirstExecutions"] == 1
    assert doc["StoreTime"] == pytest.approx(7.3)
    units = {d["Name"]: d["Unit"] for d in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert units == {"Invocations": "Count", "FirstExecutions": "Count", "StoreTime": "Milliseconds"}
    assert doc["idempotency_key"] == "orders#ab" and doc["requestId"] == "req-1"
    assert "Replays" not in doc  # zero counts are left out


def test_a_batch_document_gives_its_records():
    doc = emf.check(json.dumps(metrics.document(_tally("batch", None, 5, FirstExecutions=3, Replays=2), "N", "f", 1)))
    assert (doc["Source"], doc["Records"], doc["FirstExecutions"], doc["Replays"]) == ("batch", 5, 3, 2)
    assert "StoreTime" not in doc and "idempotency_key" not in doc


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(counts=st.dictionaries(st.sampled_from(metrics.COUNTS), st.integers(0, 10_000)),
       kind=st.sampled_from(metrics.SOURCES), store=st.lists(st.floats(0, 5), max_size=20),
       function=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=64)
       .filter(str.strip))
def test_every_document_is_valid_and_carries_exactly_the_nonzero_counts(counts, kind, store, function):
    tally = _tally(kind, None if kind == "batch" else "k", 7 if kind == "batch" else 0, **counts)
    for seconds in store:
        tally.stored(seconds, False)
    doc = emf.check(json.dumps(metrics.document(tally, "Idempotency", function, 1764900000000)))
    names = {d["Name"] for d in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert names - {"Invocations", "Records", "StoreTime"} == {name for name, n in counts.items() if n}
    assert ("StoreTime" in names) == bool(store)
    for name, n in counts.items():
        assert doc.get(name, 0) == n


def test_the_tally_adds_exactly_under_threads():
    tally = metrics.Tally()
    barrier = threading.Barrier(8)

    def add() -> None:
        barrier.wait()
        for _ in range(2000):
            tally.add("Releases")
            tally.add_many(FirstExecutions=1, Replays=0)
            tally.stored(0.001, True)

    threads = [threading.Thread(target=add) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tally.counts == {"Releases": 16000, "FirstExecutions": 16000, "StoreErrors": 16000}
    assert tally.store_requests == 16000 and tally.store_s == pytest.approx(16.0)


# -- the observer ---------------------------------------------------------------------------------------------


class _Context:
    aws_request_id = "req-9"


class _Broken(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError("stdout is closed")


def test_a_failed_write_is_logged_and_never_raised(caplog):
    observer = metrics.Observer(True, "Idempotency", "orders", out=_Broken())
    tally = metrics.Tally()
    with caplog.at_level(logging.WARNING, logger="idempotency_layer"):
        observer.finish(tally, _Context(), None)
    assert "writing the invocation's metrics failed (OSError)" in caplog.text


def test_the_observer_writes_one_line_per_invocation():
    out = io.StringIO()
    observer = metrics.Observer(True, "Ns", "orders", out=out)
    for _ in range(3):
        tally = metrics.Tally()
        tally.add("Replays")
        observer.finish(tally, _Context(), ValueError("x"))
    docs = [emf.check(line) for line in out.getvalue().splitlines()]
    assert [doc["Replays"] for doc in docs] == [1, 1, 1]
    assert all(doc["requestId"] == "req-9" for doc in docs)


# -- lines ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("counts", "outcome", "says"), [
    ({"FirstExecutions": 1}, "first_run", "first run: the handler ran"),
    ({"FirstExecutions": 1, "Releases": 1}, "released", "released"),
    ({"FirstExecutions": 1, "ReleaseFailures": 1, "StoreErrors": 1}, "release_failed", "first run, not released"),
    ({"FirstExecutions": 1, "CompletionFailures": 1, "CompletionRetries": 3}, "not_completed",
     "its result was not stored"),
    ({"Replays": 1}, "replay", "replay of the stored result"),
    ({"LocalCacheReplays": 1}, "local_cache_replay", "local cache"),
    ({"InProgressConflicts": 1}, "in_progress", "in progress"),
    ({"Waits": 1, "WaitsReplayed": 1, "Replays": 1}, "replay", "waited for another invocation, then replay"),
    ({"PayloadMismatches": 1}, "mismatch", "payload mismatch"),
    ({"PassThroughs": 1}, "passed_through", "passed through"),
    ({"StoreErrors": 1}, "store_error", "store error"),
    ({}, "not_claimed", "no claim made"),
])
def test_the_line_of_each_outcome(counts, outcome, says):
    tally = _tally(**counts)
    tally.stored(0.002, False)
    message, fields = metrics.line(tally)
    assert fields["idempotency_outcome"] == outcome and says in message
    assert fields["idempotency_key"] == "orders#ab" and "key orders#ab" in message
    assert "store 2.0 ms in 1 request(s)" in message


def test_a_batch_line_counts_its_records():
    message, fields = metrics.line(_tally("batch", None, 4, FirstExecutions=2, Replays=1, InProgressConflicts=1,
                                          StoreErrors=2), KeyError("x"))
    assert message.startswith("idempotency: batch of 4 record(s): 2 first run(s), 1 replay(s), 1 in progress;")
    assert message.endswith("2 store error(s); raised KeyError")
    assert fields["idempotency_records"] == 4 and "idempotency_outcome" not in fields
    assert fields["idempotency_counts"] == {"FirstExecutions": 2, "Replays": 1, "InProgressConflicts": 1,
                                            "StoreErrors": 2}


# -- settings -------------------------------------------------------------------------------------------------

BASE = {"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "IDEMPOTENCY_TABLE": "orders", "AWS_LAMBDA_FUNCTION_NAME": "fn"}


def test_metrics_settings_default_and_choices():
    loaded = config.load(BASE)
    assert (loaded.metrics, loaded.metrics_namespace) == (False, "Idempotency")
    loaded = config.load({**BASE, "IDEMPOTENCY_METRICS": "EMF", "IDEMPOTENCY_METRICS_NAMESPACE": "Shop/Orders"})
    assert (loaded.metrics, loaded.metrics_namespace) == (True, "Shop/Orders")


@pytest.mark.parametrize(("name", "value", "says"), [
    ("IDEMPOTENCY_METRICS", "cloudwatch", "IDEMPOTENCY_METRICS='cloudwatch' is not accepted; expected one of off, emf"),
    ("IDEMPOTENCY_METRICS_NAMESPACE", "AWS/Lambda", "IDEMPOTENCY_METRICS_NAMESPACE='AWS/Lambda' is not a CloudWatch"),
    ("IDEMPOTENCY_METRICS_NAMESPACE", "a" * 256, "is not a CloudWatch namespace"),
    ("IDEMPOTENCY_METRICS_NAMESPACE", "orders{x}", "is not a CloudWatch namespace"),
])
def test_bad_metrics_settings_fail_with_one_line(name, value, says):
    with pytest.raises(IdempotencyConfigurationError) as caught:
        config.load({**BASE, name: value})
    assert says in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("lambda_level", "ours", "level"), [
    (None, None, "WARNING"),
    ("INFO", None, "INFO"),
    ("info", None, "INFO"),
    ("TRACE", None, "DEBUG"),
    ("DEBUG", None, "DEBUG"),
    ("WARN", None, "WARNING"),
    ("ERROR", None, "ERROR"),
    ("FATAL", None, "CRITICAL"),
    ("LOUD", None, "WARNING"),  # the runtime ignores a value it does not know: so does the layer
    ("DEBUG", "ERROR", "ERROR"),  # IDEMPOTENCY_LOG_LEVEL wins
    ("ERROR", "INFO", "INFO"),
])
def test_the_level_follows_lambdas_application_log_level_unless_set(lambda_level, ours, level):
    env = dict(BASE)
    if lambda_level is not None:
        env["AWS_LAMBDA_LOG_LEVEL"] = lambda_level
    if ours is not None:
        env["IDEMPOTENCY_LOG_LEVEL"] = ours
    assert config.load(env).log_level == level


def test_a_bad_idempotency_log_level_still_fails_init():
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_LOG_LEVEL='LOUD' is not accepted"):
        config.load({**BASE, "IDEMPOTENCY_LOG_LEVEL": "LOUD", "AWS_LAMBDA_LOG_LEVEL": "INFO"})


# -- off costs nothing ----------------------------------------------------------------------------------------

_PROBE = """
import sys, types
sys.path.insert(0, {layer!r})
from idempotency_layer import interceptor
from idempotency_layer.config import load
store = types.SimpleNamespace()
handler = interceptor.build(load(), lambda e, c: e, store=store)
observer = handler.__closure__[handler.__code__.co_freevars.index("observer")].cell_contents
print(handler.__qualname__, "idempotency_layer.metrics" in sys.modules, type(handler.cycle.store).__name__,
      type(observer).__name__)
"""


@pytest.mark.parametrize(("env", "observed"), [
    ({}, False),
    ({"IDEMPOTENCY_LOG_LEVEL": "WARNING", "AWS_LAMBDA_LOG_LEVEL": "INFO"}, False),
    ({"IDEMPOTENCY_METRICS": "emf"}, True),
    ({"AWS_LAMBDA_LOG_LEVEL": "INFO"}, True),
])
def test_off_means_no_import_and_the_plain_handler(tmp_path, env, observed):
    (tmp_path / "app.py").write_text("def handler(e, c):\n    return e\n")
    probe = _PROBE.format(layer=str(ROOT / "layer"))
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler",
             "IDEMPOTENCY_TABLE": "orders", "AWS_LAMBDA_FUNCTION_NAME": "fn", "AWS_REGION": "us-east-1",
             "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
             "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:9", **env},
    )
    assert done.returncode == 0, done.stderr
    name, imported, store, observer = done.stdout.split()
    assert imported == str(observed)  # off: the metrics module is not even imported
    assert observer == ("Observer" if observed else "NoneType")
    assert store == "SimpleNamespace"  # the store the cycle was given: nothing is swapped in
    assert name == "build.<locals>.handler"


@pytest.mark.parametrize(("log_format", "lambda_level", "level"), [
    ("JSON", "WARN", "WARN"), ("json", "error", "ERROR"), ("JSON", "FATAL", "FATAL"),
    ("JSON", "INFO", None), ("JSON", "DEBUG", None), ("JSON", None, None), ("Text", "WARN", None), (None, "WARN", None),
])
def test_a_document_passes_lambdas_log_level_filter(monkeypatch, log_format, lambda_level, level):
    # Lambda takes a JSON line without "level" as INFO, and drops it under an application log level of WARN or above.
    for name, value in (("AWS_LAMBDA_LOG_FORMAT", log_format), ("AWS_LAMBDA_LOG_LEVEL", lambda_level)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    out = io.StringIO()
    observer = metrics.Observer(True, "Ns", "orders", out=out)
    tally = metrics.Tally()
    tally.add("FirstExecutions")
    observer.finish(tally, _Context(), None)
    doc = emf.check(out.getvalue().strip())
    assert doc.get("level") == level
    assert ("level" in doc) == (level is not None)


class _RaisingHandler(logging.Handler):
    """As the runtime's handler behaves once the function closed stdout: every record it emits raises."""

    def emit(self, record: logging.LogRecord) -> None:
        raise ValueError("I/O operation on closed file")


def test_finish_never_raises_even_when_logging_does(monkeypatch):
    logger = logging.getLogger("idempotency_layer")
    raising = _RaisingHandler()
    monkeypatch.setattr(logger, "level", logging.INFO)
    monkeypatch.setattr(logger, "propagate", False)
    logger.addHandler(raising)
    try:
        observer = metrics.Observer(True, "Ns", "orders", out=_Broken())
        tally = metrics.Tally()
        tally.add("FirstExecutions")
        observer.finish(tally, _Context(), KeyError("the handler's own"))  # the document, the line, the warnings
    finally:
        logger.removeHandler(raising)


def test_documents_go_to_the_stdout_of_init_not_one_the_handler_swapped_in(monkeypatch):
    runtime_stdout, handlers_file = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", runtime_stdout)  # as awslambdaric sets it up before the handler's import
    observer = metrics.Observer(True, "Ns", "orders")
    monkeypatch.setattr(sys, "stdout", handlers_file)  # what a handler may do: sys.stdout = open(...)
    tally = metrics.Tally()
    tally.add("FirstExecutions")
    observer.finish(tally, _Context(), None)
    assert handlers_file.getvalue() == ""
    assert emf.check(runtime_stdout.getvalue().strip())["FirstExecutions"] == 1
