"""Lambda durable executions' invocations are recognised by their envelope and never claimed, whatever the settings."""

from __future__ import annotations

import pytest

from idempotency_layer import config as _config
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.plan import DURABLE, EVENT
from idempotency_layer.sources import plan
from idempotency_layer.sources.durable import durable_target, is_durable

FUNCTION = "orders-workflow"
ARN = f"arn:aws:lambda:us-east-1:123456789012:function:{FUNCTION}:$LATEST/durable-execution/order-42/4f1c2a9e"


def envelope(**changes):
    event = {"DurableExecutionArn": ARN, "CheckpointToken": "AAAA-token-1",
             "InitialExecutionState": {"Operations": [], "NextMarker": None}}
    event.update(changes)
    return {k: v for k, v in event.items() if v is not ...}


REGION = "us-east-1"


@pytest.mark.parametrize(("arn", "region"), [
    (ARN, REGION),
    (ARN.replace(":$LATEST/", ":7/"), REGION),
    (ARN.replace(":$LATEST/", ":$LATEST.PUBLISHED/"), REGION),
    (ARN.replace("order-42", "n" * 64), REGION),
    (ARN.replace("arn:aws:", "arn:aws-cn:").replace(REGION, "cn-north-1"), "cn-north-1"),
])
def test_an_envelope_of_this_function_is_durable(arn, region):
    assert is_durable(envelope(DurableExecutionArn=arn), FUNCTION, region)
    assert is_durable(envelope(DurableExecutionArn=arn), FUNCTION, None)  # no Region known: the name alone
    assert durable_target(envelope(DurableExecutionArn=arn)) == (FUNCTION, region)


def test_without_a_function_name_nothing_is_durable():
    assert not is_durable(envelope(), None, REGION)


def test_another_regions_execution_is_not():
    assert not is_durable(envelope(), FUNCTION, "eu-west-1")


@pytest.mark.parametrize("event", [
    envelope(InitialExecutionState=...),
    envelope(CheckpointToken=...),
    envelope(CheckpointToken=""),
    envelope(CheckpointToken=7),
    envelope(DurableExecutionArn=...),
    envelope(DurableExecutionArn=None),
    envelope(DurableExecutionArn="order-42"),
    envelope(DurableExecutionArn=ARN.replace(FUNCTION, "someone-else")),  # another function's execution
    envelope(DurableExecutionArn=ARN + "/extra"),
    envelope(DurableExecutionArn=ARN.replace("/durable-execution/", "/")),
    envelope(DurableExecutionArn=ARN.replace("order-42", "n" * 65)),  # an execution name is at most 64
    envelope(DurableExecutionArn=ARN.replace(":$LATEST/", ":live/")),  # no alias in a durable execution's ARN
    envelope(InitialExecutionState=None),
    envelope(InitialExecutionState="state"),
    envelope(InitialExecutionState=[]),
    {**envelope(), "Records": []},  # a batch or an HTTP request is never an envelope
    {**envelope(), "requestContext": {}},
    [envelope()],
    "DurableExecutionArn",
    None,
])
def test_anything_else_is_not(event):
    assert not is_durable(event, FUNCTION, REGION)


def _config_with(**env):
    base = {"IDEMPOTENCY_TABLE": "idempotency", "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler",
            "AWS_LAMBDA_FUNCTION_NAME": FUNCTION, "AWS_REGION": REGION}
    return _config.load({**base, **env})


@pytest.mark.parametrize("env", [
    {}, {"IDEMPOTENCY_SCOPE": "record"}, {"IDEMPOTENCY_SCOPE": "event"},
    {"IDEMPOTENCY_KEY_JMESPATH": "CheckpointToken"},
    {"IDEMPOTENCY_REQUIRE_KEY": "true", "IDEMPOTENCY_KEY_JMESPATH": "orderId"}, {"IDEMPOTENCY_HTTP": "off"},
])
def test_the_plan_passes_a_durable_invocation_through_whatever_the_settings(env):
    config = _config_with(**env)
    keys = KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath)
    assert plan(config, keys, envelope()).kind == DURABLE


def test_the_plan_still_keys_an_event_that_only_looks_alike():
    config = _config_with()
    found = plan(config, KeyDeriver(FUNCTION, None), envelope(DurableExecutionArn=ARN.replace(FUNCTION, "other")))
    assert found.kind == EVENT and found.units[0].key is not None


def test_the_cli_says_a_durable_invocation_has_no_key(tmp_path, monkeypatch, capsys):
    import json

    from idempotency_layer import cli

    path = tmp_path / "durable.json"
    path.write_text(json.dumps(envelope()))
    for name in ("IDEMPOTENCY_KEY_JMESPATH", "IDEMPOTENCY_SCOPE", "IDEMPOTENCY_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)
    assert cli.main(["key", "--event", str(path), "--key-jmespath", "CheckpointToken"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "source: durable execution",
        "no key: a Lambda durable execution's invocation: the layer never claims it (a pass-through)"]


def test_the_cli_without_a_function_name_says_what_it_hinges_on(tmp_path, monkeypatch, capsys):
    import json

    from idempotency_layer import cli

    path = tmp_path / "durable.json"
    path.write_text(json.dumps(envelope()))
    for name in ("IDEMPOTENCY_KEY_JMESPATH", "IDEMPOTENCY_SCOPE", "AWS_LAMBDA_FUNCTION_NAME"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["key", "--event", str(path), "--key-prefix", "orders"]) == 0  # keyed whole, as the layer would
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["source: whole event", "key from: the whole event (the default: IDEMPOTENCY_KEY_JMESPATH is "
                       "unset or @)", f"note: the envelope of a durable execution of function {FUNCTION!r} "
                       f"in {REGION}: the layer passes it through, unclaimed, when it runs as that function there; "
                       "pass --function-name (and --region) to know"]
    assert out[3].startswith("orders#")


def test_the_cli_gives_an_executions_key_and_names_the_execution(tmp_path, monkeypatch, capsys):
    import json

    from idempotency_layer import cli

    path = tmp_path / "durable.json"
    operation = {"Id": ARN.rsplit("/", 1)[-1], "Type": "EXECUTION", "ExecutionDetails": {
        "InputPayload": json.dumps({"orderId": "o-7"})}}
    path.write_text(json.dumps(envelope(InitialExecutionState={"Operations": [operation]})))
    for name in ("IDEMPOTENCY_SCOPE", "IDEMPOTENCY_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)
    monkeypatch.setenv("IDEMPOTENCY_DURABLE", "execution")
    monkeypatch.setenv("IDEMPOTENCY_IN_PROGRESS_SECONDS", "3600")
    assert cli.main(["key", "--event", str(path), "--key-jmespath", "orderId"]) == 0
    expected = KeyDeriver(FUNCTION, "orderId", None).key({"orderId": "o-7"})
    assert capsys.readouterr().out.splitlines() == [
        "source: durable execution, keyed by its input (IDEMPOTENCY_DURABLE=execution)",
        f"execution: {ARN} (`show --event` says whether it owns the key)",
        "key from: IDEMPOTENCY_KEY_JMESPATH='orderId', applied to the execution's input",
        expected]
