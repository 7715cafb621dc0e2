"""The hostile review's findings on the CLI's pure parts: the wrapper rules per package type, a deployed
function's runtime, architecture and next wrapper, how a boto3 failure is told, times beyond the calendar,
what `show` says a copy does, event files as the runtime parses them, no HTTP path or query in `key`'s
output, non-finite results, escaped attributes, and main's last resort."""

from __future__ import annotations

import json
import time

import pytest
from botocore.exceptions import ClientError, NoCredentialsError, ReadTimeoutError

from idempotency_layer import codec
from idempotency_layer.cli import main
from idempotency_layer.cli import settings as cli_settings
from idempotency_layer.cli.derive import EventFileError, derive, read_event
from idempotency_layer.cli.derive import text as key_text
from idempotency_layer.cli.doctor import FAIL, PASS, WARN, aws_failure, function_checks, wrapper_check
from idempotency_layer.cli.output import clean, finite, said, when
from idempotency_layer.cli.records import facts, show_text
from idempotency_layer.stores.protocol import COMPLETED, Record
from tests.support import http_events

LAYER = "arn:aws:lambda:us-east-1:123456789012:layer:idempotency-layer-{}:3"


# -- 1. the wrapper ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("package", "wrapper", "status"), [
    ("zip", "/opt/idempotency-wrapper", PASS),
    ("zip", "/var/lang/bin/idempotency-wrapper", FAIL),  # a layer lives in /opt
    ("zip", None, FAIL),
    ("image", "/var/lang/bin/idempotency-wrapper", PASS),
    ("image", "/var/task/bin/idempotency-wrapper", PASS),
    ("image", "/opt/idempotency-wrapper", PASS),
    ("image", None, WARN),  # the wrapper may be the image's ENTRYPOINT
    ("image", "  ", WARN),
    ("image", "bin/idempotency-wrapper", FAIL),
    ("image", "/var/lang/bin/idempotency-wrapper.sh", FAIL),
    ("local", "/var/lang/bin/idempotency-wrapper", PASS),
    ("local", "/opt/idempotency-wrapper", PASS),
    ("local", None, WARN),
    ("local", "/opt/other", FAIL),
])
def test_wrapper_rules(package, wrapper, status):
    check = wrapper_check(wrapper, package)
    assert check.status == status, check
    if package == "image" and status != PASS:
        assert "/opt" not in check.fix  # an image is never pointed at the layer's path
    if status == FAIL:
        assert check.fix


def test_an_image_function_with_the_wheels_wrapper_passes():
    image = {"PackageType": "Image", "Role": "r", "Environment": {"Variables": {
        "AWS_LAMBDA_EXEC_WRAPPER": "/var/lang/bin/idempotency-wrapper"}}}
    assert [(c.name, c.status) for c in function_checks(image, "idempotency")] == [
        ("layer", WARN), ("wrapper", PASS), ("role", PASS)]


# -- 2. runtime, architecture, next wrapper ---------------------------------------------------------------------

def _function(**changes):
    configuration = {"Runtime": "python3.12", "Role": "r", "Layers": [{"Arn": LAYER.format("x86_64")}],
                     "Environment": {"Variables": {"AWS_LAMBDA_EXEC_WRAPPER": "/opt/idempotency-wrapper"}}}
    configuration.update(changes)
    return {c.name: c for c in function_checks(configuration, "idempotency")}


@pytest.mark.parametrize(("runtime", "status"), [
    ("python3.10", PASS), ("python3.14", PASS), ("python3.9", FAIL), ("python3.15", FAIL), ("nodejs22.x", FAIL),
    (None, FAIL), ("python3.x", FAIL)])
def test_runtime(runtime, status):
    check = _function(Runtime=runtime)["runtime"]
    assert check.status == status
    if status == FAIL:
        assert "python3.10 to python3.14" in check.detail and check.fix


@pytest.mark.parametrize(("architectures", "layer", "status"), [
    (None, "x86_64", PASS), (["x86_64"], "x86_64", PASS), (["arm64"], "arm64", PASS),
    (["arm64"], "x86_64", FAIL), (None, "arm64", FAIL), (["arm64"], "custom", WARN)])
def test_architecture_matches_the_layer(architectures, layer, status):
    changes = {"Layers": [{"Arn": LAYER.format(layer)}]}
    if architectures is not None:
        changes["Architectures"] = architectures
    check = _function(**changes)["architecture"]
    assert check.status == status, check
    if status == FAIL:
        wanted = (architectures or ["x86_64"])[0]
        assert check.fix == f"attach the idempotency-layer-{wanted} layer's version ARN"


@pytest.mark.parametrize(("value", "status"), [("/opt/next", PASS), ("next", FAIL), ("./next", FAIL),
                                               ("", None), ("  ", None), (None, None)])
def test_next_wrapper_must_be_absolute(value, status):
    variables = {"AWS_LAMBDA_EXEC_WRAPPER": "/opt/idempotency-wrapper"}
    if value is not None:
        variables["IDEMPOTENCY_NEXT_WRAPPER"] = value
    check = _function(Environment={"Variables": variables}).get("next wrapper")
    assert (check and check.status) == status


def test_an_image_has_no_runtime_to_check():
    assert "runtime" not in _function(PackageType="Image", Runtime=None)


# -- 3/4. how a boto3 failure is told -----------------------------------------------------------------------------

@pytest.mark.parametrize(("error", "said"), [
    (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), ("ReadTimeoutError", "transient")),
    (NoCredentialsError(), ("NoCredentialsError", "access")),
    (ClientError({"Error": {"Code": "AccessDeniedException"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "Get"),
     ("AccessDeniedException", "access")),
    (ClientError({"Error": {"Code": "ServiceException"}, "ResponseMetadata": {"HTTPStatusCode": 500}}, "Get"),
     ("ServiceException", "transient")),
    (ClientError({"Error": {"Code": "Odd"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "Get"),
     ("Odd", "transient")),
    (ClientError({"Error": {"Code": "TooManyRequestsException"}, "ResponseMetadata": {"HTTPStatusCode": 429}},
                 "Get"), ("TooManyRequestsException", "transient")),
    (ClientError({"Error": {"Code": "AWS.SimpleQueueService.NonExistentQueue"}}, "GetQueueUrl"),
     ("AWS.SimpleQueueService.NonExistentQueue", "missing")),
    (ClientError({"Error": {"Code": "QueueDoesNotExist"}}, "GetQueueUrl"), ("QueueDoesNotExist", "missing")),
])
def test_aws_failure(error, said):
    assert aws_failure(error) == said


# -- 5. times beyond the calendar --------------------------------------------------------------------------------

@pytest.mark.parametrize("stored", [99999999999999999999, 10**400, -(10**20)])
def test_a_time_beyond_the_calendar_is_shown_raw(stored):
    moment = when(stored, time.time())
    assert said(moment) == f"{stored} (out of range)"
    assert when(stored, time.time(), 1000)["out_of_range"]


# -- 7. what a copy of a completed record does, by its result format ---------------------------------------------

@pytest.mark.parametrize(("form", "meaning"), [
    (codec.TOO_LARGE, "copies raise IdempotencyResultTooLargeError"),
    (codec.DONE, "copies of the record are skipped (reported done, the handler does not see them)"),
    (codec.JSON, "copies replay the stored result"),
])
def test_show_says_what_a_copy_does(form, meaning):
    data = None if form in (codec.TOO_LARGE, codec.DONE) else "{}"
    record = Record("orders#k", COMPLETED, int(time.time()) + 60, None, "o", codec.Encoded(form, data))
    shown = facts(record, time.time(), False)
    assert meaning in shown["meaning"]
    if form != codec.JSON:
        assert "replay the stored result" not in shown["meaning"]


# -- 8. event files as the runtime parses them -------------------------------------------------------------------

def test_a_byte_order_mark_is_accepted(tmp_path):
    (tmp_path / "bom.json").write_bytes(b'\xef\xbb\xbf{"orderId": "o-1"}')
    assert read_event(str(tmp_path / "bom.json")) == {"orderId": "o-1"}


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused_as_the_runtime_refuses_them(tmp_path, capsys, constant):
    path = tmp_path / "nan.json"
    path.write_text(f'{{"amount": {constant}}}')
    with pytest.raises(EventFileError, match=r"Runtime\.UnmarshalError"):
        read_event(str(path))
    assert main(["key", "--event", str(path), "--function-name", "orders"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"holds {constant} (not JSON)" in err


# -- 6. key prints no path, route, query or header value ---------------------------------------------------------

def test_key_output_has_no_http_path_route_or_query(tmp_path, capsys):
    secret = "SECRET-PAN-4111111111111111"
    v2 = http_events.v2("POST", f"/pay/{secret}", {"Idempotency-Key": "k-1", "X-Card": secret}, "{}",
                        route=f"POST /pay/{secret}")
    v2["rawQueryString"] = f"card={secret}"
    v2["queryStringParameters"] = {"card": secret}
    v1 = http_events.rest("POST", f"/pay/{secret}", {"Idempotency-Key": "k-1"}, "{}", resource=f"/pay/{secret}")
    v1["queryStringParameters"] = {"card": secret}
    alb = http_events.alb("POST", f"/pay/{secret}", {"Idempotency-Key": "k-1"}, "{}")
    alb["queryStringParameters"] = {"card": secret}
    config = cli_settings.load({"AWS_LAMBDA_FUNCTION_NAME": "orders"}, need_table=False)
    for event in (v2, v1, alb):
        found = derive(config, event)
        assert found["source"] == "http" and found["method"] == "POST"
        assert secret not in json.dumps(found) and secret not in "\n".join(key_text(found))
        (tmp_path / "event.json").write_text(json.dumps(event))
        for extra in ([], ["--json"]):
            assert main(["key", "--event", str(tmp_path / "event.json"), "--function-name", "orders", *extra]) == 0
            out = capsys.readouterr()
            assert secret not in out.out + out.err and "k-1" not in out.out
    assert key_text(derive(config, v2))[0] == "source: HTTP request (v2: POST)"


# -- 9. non-finite results, escaped attributes --------------------------------------------------------------------

def test_finite_and_clean():
    assert finite({"a": [float("nan"), float("inf"), -float("inf"), 1.0, "x"]}) == {
        "a": ["NaN", "Infinity", "-Infinity", 1.0, "x"]}
    assert clean("o-1\nkey: x\x1b[2J\x00") == "o-1\\nkey: x\\x1b[2J\\x00"
    assert clean("plain owner é") == "plain owner é"
    record = Record("orders#k\x1b", COMPLETED, int(time.time()) + 60, None, "a\rb", codec.Encoded("json\n", "{}"),
                    "f\x07")
    text = "\n".join(show_text(facts(record, time.time(), False)))
    assert not any(c in text for c in "\x1b\r\x07") and text.count("\n") == 6


# -- 5. main's last resort ----------------------------------------------------------------------------------------

def test_an_unexpected_error_is_one_line_unless_the_traceback_is_asked_for(monkeypatch, capsys, tmp_path):
    import idempotency_layer.cli as cli

    (tmp_path / "event.json").write_text("{}")
    args = ["key", "--event", str(tmp_path / "event.json"), "--function-name", "orders"]

    def broken(*_: object) -> int:
        raise RuntimeError("a bug\nwith two lines " + "x" * 400)

    monkeypatch.setattr(cli, "_key", broken)
    monkeypatch.delenv("IDEMPOTENCY_CLI_TRACEBACK", raising=False)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("idempotency-layer: unexpected error: RuntimeError: a bug with")
    assert "x" * 301 not in err and "IDEMPOTENCY_CLI_TRACEBACK=1" in err
    monkeypatch.setenv("IDEMPOTENCY_CLI_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="a bug"):
        main(args)

    def interrupted(*_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_key", interrupted)
    assert main(args) == 130


def test_strict_counts_a_warning_once(monkeypatch, capsys):
    from idempotency_layer.cli import doctor

    checks = [doctor.Check("a", PASS, "ok"), doctor.Check("b", WARN, "hm", "fix b"), doctor.Check("c", FAIL, "no", "x")]
    monkeypatch.setattr(doctor, "run", lambda args, env: checks)
    assert main(["doctor", "--strict", "--table", "t"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "2 failed, 0 warning(s), 1 passed"
    assert main(["doctor", "--table", "t"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "1 failed, 1 warning(s), 1 passed"
    monkeypatch.setattr(doctor, "run", lambda args, env: checks[:2])
    assert main(["doctor", "--strict", "--table", "t"]) == 1
    assert main(["doctor", "--table", "t"]) == 0
