"""The CLI's pure parts: options over settings, time formatting, key facts, event-file errors, the doctor's
checks of a deployed function and its mappings, and that the layer and the CLI never import each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from idempotency_layer.cli import main
from idempotency_layer.cli import settings as cli_settings
from idempotency_layer.cli.derive import EventFileError, derive, keys_of, read_event
from idempotency_layer.cli.derive import text as key_text
from idempotency_layer.cli.doctor import FAIL, PASS, WARN, function_checks, mapping_checks, timeout_check
from idempotency_layer.cli.output import relative
from idempotency_layer.errors import IdempotencyConfigurationError
from idempotency_layer.keys import KeyDeriver
from tests.support import events, http_events

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000


def settings(**env: str):
    return cli_settings.load({"AWS_LAMBDA_FUNCTION_NAME": "orders", **env}, need_table=False)


@pytest.mark.parametrize(("offset", "said"), [
    (0, "now"), (5, "in 5s"), (250, "in 4m 10s"), (-3 * 3600 - 125, "3h 2m ago"), (2 * 86400 + 7200 + 59, "in 2d 2h"),
    (-59.6, "1m ago"),
])
def test_relative_time(offset, said):
    assert relative(NOW + offset, NOW) == said


def test_options_override_the_environment():
    parser = main.__globals__["_parser"]()
    args = parser.parse_args(["key", "--event", "-", "--table", "t-1", "--key-prefix", "p", "--region", "eu-west-1",
                              "--set", "IDEMPOTENCY_STATUS_ATTR=state", "--endpoint-url", "http://127.0.0.1:9"])
    env = cli_settings.environment(args, {"IDEMPOTENCY_TABLE": "from-env", "AWS_REGION": "us-east-1"})
    assert env["IDEMPOTENCY_TABLE"] == "t-1"
    assert env["IDEMPOTENCY_KEY_PREFIX"] == "p"
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert env["AWS_ENDPOINT_URL_DYNAMODB"] == "http://127.0.0.1:9"
    config = cli_settings.load(env)
    assert (config.table, config.key_prefix, config.attributes.status) == ("t-1", "p", "state")
    assert config.original_handler == cli_settings.PLACEHOLDER_HANDLER  # no handler is ever loaded


def test_a_set_that_is_not_a_setting_is_refused():
    args = main.__globals__["_parser"]().parse_args(["key", "--event", "-", "--set", "AWS_PROFILE=x"])
    with pytest.raises(IdempotencyConfigurationError, match=r"--set 'AWS_PROFILE=\.\.\.' is not accepted"):
        cli_settings.environment(args, {})


def test_a_bad_setting_gives_inits_message_in_one_line(capsys, tmp_path):
    event = tmp_path / "event.json"
    event.write_text("{}")
    env = {"AWS_LAMBDA_FUNCTION_NAME": "orders", "IDEMPOTENCY_SCOPE": "batch", "IDEMPOTENCY_TABLE": "t-1"}
    with pytest.raises(IdempotencyConfigurationError) as init:
        cli_settings.load(env)
    status = main(["key", "--event", str(event), "--set", "IDEMPOTENCY_SCOPE=batch", "--function-name", "orders"])
    err = capsys.readouterr().err
    assert status == 2
    assert err == f"idempotency-layer: {init.value}\n"


@pytest.mark.parametrize("where", ["--set", "environment"])
def test_a_mistyped_setting_name_fails_the_cli_as_it_fails_init(capsys, tmp_path, monkeypatch, where):
    event = tmp_path / "event.json"
    event.write_text('{"ttl": 5}')
    arguments = ["key", "--event", str(event), "--function-name", "orders"]
    if where == "--set":
        arguments += ["--set", "IDEMPOTENCY_TTL=5"]
    else:
        monkeypatch.setenv("IDEMPOTENCY_TTL", "5")
    assert main(arguments) == 2
    assert capsys.readouterr().err == (
        "idempotency-layer: IDEMPOTENCY_TTL is set, but it is not a setting of this layer (did you mean "
        "IDEMPOTENCY_TTL_SECONDS?); a misspelled setting would be ignored, so init fails (the README lists every "
        "setting)\n")


def test_whole_event_key_is_the_layers():
    config = settings(IDEMPOTENCY_KEY_JMESPATH="orderId", IDEMPOTENCY_PAYLOAD_JMESPATH="amount")
    facts = derive(config, {"orderId": "o-1", "amount": 5})
    deriver = KeyDeriver("orders", "orderId", "amount")
    assert facts["source"] == "event"
    assert keys_of(facts) == [deriver.key({"orderId": "o-1"})]
    assert facts["entries"][0]["fingerprint"] == deriver.fingerprint({"amount": 5})


def test_key_says_where_the_key_came_from_the_expression_or_a_default():
    """Issue 29: `key --event` printed `source: whole event` for both paymentId and the default."""
    order = {"paymentId": "p-1", "requestedAt": "10:00"}
    rules = {
        None: "the whole event (the default: IDEMPOTENCY_KEY_JMESPATH is unset or @)",
        "paymentId": "IDEMPOTENCY_KEY_JMESPATH='paymentId'",
    }
    for expression, said in rules.items():
        config = settings(**({"IDEMPOTENCY_KEY_JMESPATH": expression} if expression else {}))
        facts = derive(config, order)
        assert facts["rule"] == said
        assert key_text(facts)[:2] == ["source: whole event", f"key from: {said}"]
    batch = events.sqs_event([events.json_message({"orderId": "a"})])
    assert derive(settings(), batch)["rule"] == (
        "each record's delivery identity (the default: IDEMPOTENCY_KEY_JMESPATH is unset or @)")
    assert derive(settings(IDEMPOTENCY_KEY_JMESPATH="json_parse(body).orderId"), batch)["rule"] == (
        "IDEMPOTENCY_KEY_JMESPATH='json_parse(body).orderId', applied to each record")
    request = http_events.rest("POST", "/orders", {"Idempotency-Key": "k-1"}, "{}")
    assert derive(settings(), request)["rule"] == "the Idempotency-Key header"
    assert derive(settings(IDEMPOTENCY_KEY_JMESPATH="body"), request)["rule"] == (
        "the Idempotency-Key header, else IDEMPOTENCY_KEY_JMESPATH='body'")


def test_whole_event_without_a_key_says_why():
    facts = derive(settings(IDEMPOTENCY_KEY_JMESPATH="orderId"), {"other": 1})
    assert keys_of(facts) == []
    assert "selected nothing" in facts["entries"][0]["reason"] and "pass-through" in facts["entries"][0]["reason"]
    required = derive(settings(IDEMPOTENCY_KEY_JMESPATH="orderId", IDEMPOTENCY_REQUIRE_KEY="true"), {"other": 1})
    assert "refuses" in required["entries"][0]["reason"]


def test_batch_one_key_per_record_and_duplicates_share_one():
    message = events.json_message({"orderId": "a"})
    batch = {"Records": [message.deliver(events.queue_arn()), events.json_message({"x": 1}).deliver(
        events.queue_arn()), message.deliver(events.queue_arn())]}
    facts = derive(settings(), batch)
    assert facts["source"] == "batch" and facts["batch_source"] == "SQS"
    assert [entry["id"] for entry in facts["entries"]] == [record["messageId"] for record in batch["Records"]]
    first, second, again = (entry["key"] for entry in facts["entries"])
    assert first == again != second
    assert facts["entries"][2]["same_as"] == 0
    assert keys_of(facts) == [first, second]


def test_batch_expression_for_the_whole_event_is_refused_as_the_layer_refuses_it():
    batch = events.sqs_event([events.json_message({"orderId": "a"})])
    facts = derive(settings(IDEMPOTENCY_KEY_JMESPATH="Records[0].messageId"), batch)
    assert keys_of(facts) == [] and "IDEMPOTENCY_SCOPE=event" in facts["error"]


def test_http_request_key_or_why_none():
    config = settings()
    with_key = derive(config, http_events.v2("POST", "/orders", {"Idempotency-Key": "k-1"}, "{}"))
    assert with_key["source"] == "http" and with_key["method"] == "POST"
    assert len(keys_of(with_key)) == 1
    entry = with_key["entries"][0]
    assert entry["previous_key"].startswith("orders#") and entry["previous_key"] != entry["key"]  # read by a first run
    assert f"previous key {entry['previous_key']}" in "\n".join(key_text(with_key))
    off = derive(settings(IDEMPOTENCY_HTTP_PREVIOUS_KEYS="off"), http_events.v2("POST", "/o", {"Idempotency-Key": "k"},
                                                                               "{}"))
    assert "previous_key" not in off["entries"][0]
    without = derive(config, http_events.v2("POST", "/orders", {}, "{}"))
    assert keys_of(without) == [] and "has no Idempotency-Key header" in without["entries"][0]["reason"]
    bad = derive(config, http_events.rest("POST", "/orders", {"Idempotency-Key": "a,b"}, "{}"))
    assert keys_of(bad) == [] and bad["entries"][0]["reason"].startswith("answered 400")


def test_secrets_of_the_event_are_never_in_the_facts():
    secret = "4111-1111-1111-1111"
    in_the_url = http_events.v2("POST", f"/pay/{secret}", {"Idempotency-Key": secret}, secret,
                                route=f"POST /pay/{secret}")
    in_the_url.update(rawQueryString=f"card={secret}", queryStringParameters={"card": secret})
    for event in ({"orderId": secret}, http_events.v2("POST", "/o", {"Idempotency-Key": secret}, secret),
                  in_the_url, events.sqs_event([events.json_message({"card": secret})])):
        found = derive(settings(IDEMPOTENCY_KEY_JMESPATH="orderId"), event)
        assert secret not in json.dumps(found)
        assert secret not in "\n".join(key_text(found))  # the text output too


def test_event_file_errors_name_the_problem_not_the_content(tmp_path):
    (tmp_path / "bad.json").write_text('{"card": "4111-1111" ')
    with pytest.raises(EventFileError, match=r"is not JSON: .* \(line 1, column") as bad:
        read_event(str(tmp_path / "bad.json"))
    assert "4111" not in str(bad.value)
    with pytest.raises(EventFileError, match="No such file or directory"):
        read_event(str(tmp_path / "missing.json"))
    with pytest.raises(EventFileError, match="Is a directory"):
        read_event(str(tmp_path))
    (tmp_path / "latin1.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(EventFileError, match="not UTF-8"):
        read_event(str(tmp_path / "latin1.json"))


def test_function_checks():
    good = {"Layers": [{"Arn": "arn:aws:lambda:us-east-1:123456789012:layer:idempotency-layer-x86_64:3"}],
            "Environment": {"Variables": {"AWS_LAMBDA_EXEC_WRAPPER": "/opt/idempotency-wrapper"}},
            "Role": "arn:aws:iam::123456789012:role/r", "Runtime": "python3.12"}
    checks = function_checks(good, "idempotency")
    assert [(c.name, c.status) for c in checks] == [
        ("runtime", PASS), ("layer", PASS), ("architecture", PASS), ("wrapper", PASS), ("role", PASS)]
    bare = {"Layers": [{"Arn": "arn:aws:lambda:us-east-1:123456789012:layer:other:1"}], "Environment": {},
            "Runtime": "python3.12"}
    checks = function_checks(bare, "idempotency")
    assert [(c.name, c.status) for c in checks] == [("runtime", PASS), ("layer", FAIL), ("wrapper", FAIL),
                                                    ("role", FAIL)]
    assert "AWS_LAMBDA_EXEC_WRAPPER=/opt/idempotency-wrapper" in checks[2].fix
    image = function_checks({"PackageType": "Image", "Role": "r"}, "idempotency")
    assert [(c.name, c.status) for c in image] == [("layer", WARN), ("wrapper", WARN), ("role", PASS)]
    assert timeout_check(10, 10).status == WARN and timeout_check(10, 2).status == PASS


# moto does not implement CreateEventSourceMapping for Kafka (MSK or self-managed): its checks are covered here.
@pytest.mark.parametrize(("mapping", "expected"), [
    ({"UUID": "k1", "EventSourceArn": "arn:aws:kafka:us-east-1:123456789012:cluster/c/1",
      "FunctionResponseTypes": ["ReportBatchItemFailures"], "ProvisionedPollerConfig": {"MinimumPollers": 1},
      "DestinationConfig": {"OnFailure": {"Destination": "arn:aws:sqs:us-east-1:123456789012:dlq"}}},
     [PASS, PASS, PASS]),
    ({"UUID": "k2", "SelfManagedEventSource": {"Endpoints": {}}}, [FAIL, FAIL, FAIL]),
    ({"UUID": "s1", "EventSourceArn": "arn:aws:kinesis:us-east-1:123456789012:stream/s"}, [FAIL, FAIL]),
    ({"UUID": "m1", "EventSourceArn": "arn:aws:mq:us-east-1:123456789012:broker:b"}, [PASS]),
])
def test_mapping_checks(mapping, expected):
    checks = mapping_checks(mapping, 30)
    assert [c.status for c in checks] == expected
    assert all(c.fix for c in checks if c.status == FAIL)


def test_sqs_mapping_checks_visibility_and_dead_letters():
    mapping = {"UUID": "q", "EventSourceArn": "arn:aws:sqs:us-east-1:123456789012:q",
               "FunctionResponseTypes": ["ReportBatchItemFailures"]}
    ok = mapping_checks(mapping, 30, {"VisibilityTimeout": "180", "RedrivePolicy": "{}"})
    assert [c.status for c in ok] == [PASS, PASS, PASS]
    short = mapping_checks(mapping, 30, {"VisibilityTimeout": "179"})
    assert [c.status for c in short] == [PASS, FAIL, FAIL]
    assert "VisibilityTimeout=180" in short[1].fix
    assert [c.status for c in mapping_checks(mapping, 30, None)] == [PASS, FAIL]


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=ROOT, check=False)


def test_the_layer_never_imports_the_cli_and_the_cli_never_imports_the_interceptor(tmp_path):
    (tmp_path / "app.py").write_text("def handler(event, context):\n    return event\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'layer'}{os.pathsep}{tmp_path}",
           "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "IDEMPOTENCY_TABLE": "t-1",
           "AWS_LAMBDA_FUNCTION_NAME": "orders", "IDEMPOTENCY_DISABLED": "true"}
    layer = _python("import sys, idempotency_layer.interceptor as i; "
                    "print(sorted(m for m in sys.modules if m.startswith('idempotency_layer.cli')))", env)
    assert layer.returncode == 0, layer.stderr
    assert layer.stdout.strip() == "[]"
    cli = _python("import sys, idempotency_layer.cli.derive, idempotency_layer.cli.records, "
                  "idempotency_layer.cli.doctor; print('idempotency_layer.interceptor' in sys.modules)", env)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == "False"


def test_the_plan_imports_a_source_module_only_for_an_event_of_its_kind():
    code = (
        "import sys\n"
        "from idempotency_layer.cli.settings import load\n"
        "from idempotency_layer.keys import KeyDeriver\n"
        "from idempotency_layer.sources import plan\n"
        "config = load({'AWS_LAMBDA_FUNCTION_NAME': 'f', 'IDEMPOTENCY_TABLE': 't-1'})\n"
        "keys = KeyDeriver('f', None)\n"
        "loaded = lambda: sorted(m for m in sys.modules if m.startswith('idempotency_layer.sources.'))\n"
        "print(plan(config, keys, {'orderId': 1, 'Records': 'not a list'}).kind, loaded())\n"
        "print(plan(config, keys, {'Records': [{'eventSource': 'aws:sqs', 'messageId': 'm'}]}).kind, loaded())\n"
        "print(plan(config, keys, {'version': '2.0', 'requestContext': {'http': {'method': 'GET'}}}).kind, loaded())\n"
    )
    done = _python(code, {**os.environ, "PYTHONPATH": str(ROOT / "layer")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "event ['idempotency_layer.sources.durable']",
        "batch ['idempotency_layer.sources.batch', 'idempotency_layer.sources.durable', "
        "'idempotency_layer.sources.records']",
        "http ['idempotency_layer.sources.batch', 'idempotency_layer.sources.durable', "
        "'idempotency_layer.sources.http', 'idempotency_layer.sources.records']",
    ]


def test_batch_copy_with_another_payload_is_flagged_as_the_layer_fails_it():
    message = events.json_message({"orderId": "a", "amount": 1})
    first = message.deliver(events.queue_arn())
    changed = {**message.deliver(events.queue_arn()), "body": json.dumps({"orderId": "a", "amount": 2})}
    facts = derive(settings(IDEMPOTENCY_PAYLOAD_JMESPATH="json_parse(body).amount"), {"Records": [first, changed]})
    assert facts["entries"][1]["same_as"] == 0
    assert facts["entries"][1]["reason"].startswith("reported as failed")
    assert "reported as failed" in "\n".join(key_text(facts))


def _bare_cli(tmp_path, *arguments: str, modules: tuple[str, ...] = (), **env: str):
    """The CLI in a Python without site-packages: the layer's package and only `modules` importable."""
    import importlib

    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    for name in modules:
        origin = Path(importlib.import_module(name).__file__)
        if origin.name == "__init__.py":
            (site / name).symlink_to(origin.parent, target_is_directory=True)
        else:
            (site / origin.name).symlink_to(origin)
    clean = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PYTHONPATH": f"{ROOT / 'layer'}:{site}",
             "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), **env}
    return subprocess.run([sys.executable, "-S", "-m", "idempotency_layer", *arguments], env=clean,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("modules", "said"), [
    ((), "idempotency-layer: the module 'orjson' is missing: from an unzipped layer, put "
         "opt/python/lib/python3.X/site-packages on PYTHONPATH"),
    (("orjson",), "idempotency-layer: the module 'jmespath' is missing: install it (pip install jmespath; boto3 "
                  "brings it)"),
])
def test_a_missing_module_is_a_setting_problem_with_its_fix(tmp_path, modules, said):
    event = tmp_path / "event.json"
    event.write_text('{"orderId": "o-1"}')
    done = _bare_cli(tmp_path, "key", "--event", str(event), "--function-name", "orders", "--key-jmespath",
                     "orders[0].id", modules=modules)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize(("arguments", "said"), [
    ((), "idempotency-layer: no AWS Region is set: set AWS_REGION, or pass --region\n"),
    (("--region", "eu-west-1", "--endpoint-url", "localhost:8000"),
     "idempotency-layer: the DynamoDB endpoint 'localhost:8000' is not an http:// or https:// URL: give it with "
     "its scheme (--endpoint-url http://localhost:8000, https://dynamodb.eu-west-1.amazonaws.com)\n"),
    (("--region", "us east 1"), "idempotency-layer: the Region 'us east 1' is not a Region name: set AWS_REGION (or "
                                "--region) to one, e.g. eu-west-1\n"),
])
def test_no_region_or_an_endpoint_without_a_scheme_is_exit_2_with_the_fix(tmp_path, arguments, said):
    done = _bare_cli(tmp_path, "show", "orders#k", "--table", "orders-table", "--function-name", "orders", *arguments,
                     modules=("orjson", "jmespath", "botocore", "dateutil", "urllib3", "six"),
                     AWS_ACCESS_KEY_ID="AKIDEXAMPLE", AWS_SECRET_ACCESS_KEY="secret")
    assert (done.returncode, done.stderr) == (2, said)


def test_a_set_in_the_wrong_case_is_named_by_init_and_no_value_is_echoed(capsys, tmp_path):
    event = tmp_path / "event.json"
    event.write_text("{}")
    status = main(["key", "--event", str(event), "--function-name", "orders", "--set",
                   "idempotency_key_jmespath=secret-ish"])
    err = capsys.readouterr().err
    assert status == 2 and "did you mean IDEMPOTENCY_KEY_JMESPATH?" in err and "secret-ish" not in err
    assert main(["key", "--event", str(event), "--set", "AWS_PROFILE=secret-ish"]) == 2
    assert "secret-ish" not in capsys.readouterr().err


def test_without_botocore_the_cli_names_the_fix(tmp_path):
    done = _bare_cli(tmp_path, "show", "orders#k", "--table", "orders-table", "--function-name", "orders",
                     "--region", "eu-west-1", modules=("orjson", "jmespath"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("idempotency-layer: the module 'botocore' is missing: outside Lambda the CLI "
                                  "finds its Region, endpoint and credentials with botocore; pip install boto3")


@pytest.mark.parametrize(("settings", "status", "said"), [
    ({}, WARN, "right when the function gets only batch records (keyed by their delivery identity) and HTTP "
               "requests (by their Idempotency-Key header)"),
    ({"IDEMPOTENCY_SCOPE": "event"}, WARN, "right when the function gets only HTTP requests"),
    ({"IDEMPOTENCY_SCOPE": "event", "IDEMPOTENCY_HTTP": "off"}, WARN, "run twice"),
    ({"IDEMPOTENCY_SCOPE": "record"}, PASS, "each batch record by its delivery identity"),
    ({"IDEMPOTENCY_KEY_JMESPATH": "@"}, WARN, "unset (or @)"),
])
def test_doctors_key_check_says_which_defaults_are_right_under_the_settings(settings, status, said):
    from idempotency_layer.cli.doctor import key_check

    check = key_check(cli_settings.load({"AWS_LAMBDA_FUNCTION_NAME": "orders", **settings}, need_table=False))
    assert check.status == status and said in check.detail, check
    if settings.get("IDEMPOTENCY_HTTP") == "off":
        assert "right when" not in check.detail  # no source has a rule of its own left


def test_a_missing_prefix_names_the_options_and_a_whole_key_needs_none(capsys, tmp_path, monkeypatch):
    for name in ("AWS_LAMBDA_FUNCTION_NAME", "IDEMPOTENCY_KEY_PREFIX", "IDEMPOTENCY_SORT_KEY_ATTR"):
        monkeypatch.delenv(name, raising=False)
    event = tmp_path / "event.json"
    event.write_text("{}")
    assert main(["key", "--event", str(event)]) == 2
    assert "(here: --function-name NAME, or --key-prefix)" in capsys.readouterr().err
    assert cli_settings.load({"IDEMPOTENCY_TABLE": "t-1"}, need_prefix=False).table == "t-1"
    with pytest.raises(IdempotencyConfigurationError, match="--function-name NAME"):  # its partition value needs it
        cli_settings.load({"IDEMPOTENCY_TABLE": "t-1", "IDEMPOTENCY_SORT_KEY_ATTR": "sk"}, need_prefix=False)


def test_doctor_function_reads_aws_region_as_the_layer_does(monkeypatch):
    import boto3

    from idempotency_layer.cli import doctor

    seen = []

    class Session:
        def __init__(self, region_name=None):
            seen.append(region_name)
            raise RuntimeError("stop here")

    monkeypatch.setattr(boto3.session, "Session", Session)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    with pytest.raises(RuntimeError):
        doctor._deployed("f", None)
    with pytest.raises(RuntimeError):
        doctor._deployed("f", "us-east-2")
    assert seen == ["eu-west-1", "us-east-2"]


def test_durable_check():
    """`doctor --function` on a durable function (moto's Lambda has none: the pure check, given
    GetFunctionConfiguration's DurableConfig as Lambda's API documents it)."""
    from idempotency_layer import config as _config
    from idempotency_layer.cli.doctor import durable_check

    base = {"IDEMPOTENCY_TABLE": "orders", "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler",
            "AWS_LAMBDA_FUNCTION_NAME": "f"}
    passing = _config.load(base)
    execution = _config.load({**base, "IDEMPOTENCY_DURABLE": "execution", "IDEMPOTENCY_IN_PROGRESS_SECONDS": "3600"})
    assert durable_check(None, passing, 2) is None
    assert durable_check(None, execution, 0).status == WARN
    assert durable_check({"ExecutionTimeout": 86400}, passing, 0).status == PASS
    warned = durable_check({"ExecutionTimeout": 86400}, passing, 1)
    assert warned.status == WARN and "IDEMPOTENCY_IN_PROGRESS_SECONDS=86400" in warned.fix
    short = durable_check({"ExecutionTimeout": 86400}, execution, 1)
    assert short.status == FAIL and short.fix == "set IDEMPOTENCY_IN_PROGRESS_SECONDS=86400"
    assert durable_check({"ExecutionTimeout": 3600}, execution, 1).status == PASS
    assert durable_check({"RetentionPeriodInDays": 7}, execution, 1).status == WARN
