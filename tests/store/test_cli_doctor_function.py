"""`doctor --function NAME` against moto's server (Lambda, IAM, SQS, Kinesis) for the function and its event
source mappings, and DynamoDB Local for the table it names: the CLI runs as a subprocess, the way an operator
runs it. moto implements no Kafka event source mappings: their checks are covered by
tests/unit/test_cli_parts.py::test_mapping_checks (CreateEventSourceMapping for MSK and self-managed Kafka is
the call not covered here)."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import boto3
import pytest

from idempotency_layer.cli.checks.dynamodb import BULK_ACTIONS, ITEM_ACTIONS, KEYED_ACTIONS
from tests.store.test_cli_commands import cli_env, run
from tests.support.iam_simulator import IAMSimulator
from tests.support.sqs_server import SQSServer

WRAPPER = "/opt/idempotency-wrapper"


def client(moto: SQSServer, service: str) -> Any:
    return boto3.client(service, endpoint_url=moto.endpoint, region_name="us-east-1", aws_access_key_id="test",
                        aws_secret_access_key="test")


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("app.py", "def handler(event, context):\n    return None\n")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def deployed(moto: SQSServer) -> dict[str, Any]:
    """Two functions: `orders` set up right, `orders-bad` with every mistake doctor looks for."""
    iam, lam, sqs, kinesis = (client(moto, name) for name in ("iam", "lambda", "sqs", "kinesis"))
    role = iam.create_role(RoleName="orders-role", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
                                                "Action": "sts:AssumeRole"}]}))["Role"]["Arn"]
    layer = lam.publish_layer_version(LayerName="idempotency-layer-x86_64", Content={"ZipFile": _zip()},
                                      CompatibleRuntimes=["python3.12"])["LayerVersionArn"]
    dlq = sqs.get_queue_attributes(QueueUrl=sqs.create_queue(QueueName="orders-dlq")["QueueUrl"],
                                   AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    good_queue = sqs.create_queue(QueueName="orders-q", Attributes={
        "VisibilityTimeout": "180", "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq, "maxReceiveCount": 5})})
    bad_queue = sqs.create_queue(QueueName="orders-bad-q", Attributes={"VisibilityTimeout": "30"})
    arn = {url: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
           for url in (good_queue["QueueUrl"], bad_queue["QueueUrl"])}
    kinesis.create_stream(StreamName="orders-stream", ShardCount=1)
    stream = kinesis.describe_stream(StreamName="orders-stream")["StreamDescription"]["StreamARN"]
    return {"lambda": lam, "role": role, "layer": layer, "good_queue": arn[good_queue["QueueUrl"]],
            "bad_queue": arn[bad_queue["QueueUrl"]], "stream": stream, "dlq": dlq}


def make_function(deployed: dict[str, Any], name: str, table: str, good: bool) -> None:
    lam = deployed["lambda"]
    variables = {"IDEMPOTENCY_TABLE": table}
    if good:
        variables.update(AWS_LAMBDA_EXEC_WRAPPER=WRAPPER, IDEMPOTENCY_KEY_JMESPATH="orderId")
    lam.create_function(FunctionName=name, Runtime="python3.12", Role=deployed["role"], Handler="app.handler",
                        Code={"ZipFile": _zip()}, Timeout=30, Layers=[deployed["layer"]] if good else [],
                        Environment={"Variables": variables})
    lam.create_event_source_mapping(
        FunctionName=name, EventSourceArn=deployed["good_queue" if good else "bad_queue"], BatchSize=10,
        **({"FunctionResponseTypes": ["ReportBatchItemFailures"]} if good else {}))
    lam.create_event_source_mapping(
        FunctionName=name, EventSourceArn=deployed["stream"], StartingPosition="TRIM_HORIZON",
        **({"FunctionResponseTypes": ["ReportBatchItemFailures"],
            "DestinationConfig": {"OnFailure": {"Destination": deployed["dlq"]}}} if good else {}))


@pytest.fixture(scope="module")
def iam() -> Any:
    """IAM's policy simulator, emulated (tests/support/iam_simulator.py): moto's IAM has no SimulatePrincipalPolicy.
    The shared role `orders-role` is confined to `orders#*`, as the README's policy confines it."""
    simulator = IAMSimulator()
    simulator.grant("arn:aws:iam::123456789012:role/orders-role", list(ITEM_ACTIONS), ["orders#*"], null_guard=True)
    yield simulator
    simulator.stop()


def doctor_env(moto: SQSServer, layer_env: Any, table: str, iam: IAMSimulator | None = None) -> dict[str, str]:
    """The CLI's environment for `doctor --function`. IAM is moto's unless `iam` is given: moto does not
    implement SimulatePrincipalPolicy, so its isolation check then says it could not run (never the real IAM)."""
    env = cli_env(layer_env.endpoint, "not-the-functions-table")  # the function's own settings win
    env.update(AWS_ENDPOINT_URL_LAMBDA=moto.endpoint, AWS_ENDPOINT_URL_SQS=moto.endpoint,
               AWS_ENDPOINT_URL_IAM=iam.endpoint if iam is not None else moto.endpoint)
    del env["AWS_LAMBDA_FUNCTION_NAME"]  # the function's name is the key prefix
    return env


def test_doctor_passes_a_function_set_up_right(moto, deployed, layer_env, table, iam):
    make_function(deployed, "orders", table, good=True)
    env = doctor_env(moto, layer_env, table, iam)
    done = run(env, "doctor", "--function", "orders")
    assert done.returncode == 0, done.stdout + done.stderr
    checks = json.loads(run(env, "doctor", "--function", "orders", "--json").stdout)["checks"]
    assert all(check["status"] == "PASS" for check in checks), checks
    said = {check["name"]: check["detail"] for check in checks}
    assert said["layer"] == f"attached: {deployed['layer']}"
    assert said["settings"].startswith(f"valid: table {table}, key prefix 'orders'")
    assert said["key"].startswith("IDEMPOTENCY_KEY_JMESPATH='orderId'")  # the function's own, not the shell's
    assert said["timeout"] == "30 s"
    mappings = [check["detail"] for check in checks if check["name"].startswith("mapping")]
    assert "visibility timeout 180 s >= 6 x the 30 s timeout" in mappings
    assert "a dead-letter queue (RedrivePolicy)" in mappings
    assert f"on-failure destination {deployed['dlq']}" in mappings
    assert mappings.count("ReportBatchItemFailures is on") == 2
    assert said["permission DeleteItem"].startswith("probe key orders#doctor-probe-")
    assert said["role isolation"] == "the role is confined to orders#*: IAM's policy simulator denies every item " \
        "action on 'zz-other#x' or with no leading key, and Scan, Query and PartiQL"


def test_doctor_fails_a_function_set_up_wrong_and_prints_each_fix(moto, deployed, layer_env, table):
    make_function(deployed, "orders-bad", table, good=False)
    done = run(doctor_env(moto, layer_env, table), "doctor", "--function", "orders-bad")
    assert done.returncode == 1
    out = done.stdout
    assert "FAIL layer: no layer whose name contains 'idempotency' among 0 layer(s)" in out
    assert f"FAIL wrapper: AWS_LAMBDA_EXEC_WRAPPER is not set: the layer never runs\n     fix: set " \
           f"AWS_LAMBDA_EXEC_WRAPPER={WRAPPER}" in out
    assert out.count("ReportBatchItemFailures is off") == 2
    assert out.count("--function-response-types ReportBatchItemFailures") == 2
    assert "visibility timeout 30 s < 6 x the function's 30 s timeout" in out
    assert "fix: aws sqs set-queue-attributes --queue-url http" in out and "orders-bad-q --attributes " \
        "VisibilityTimeout=180" in out
    assert "no dead-letter queue" in out and "no on-failure destination" in out
    # the table checks still ran with the function's settings
    assert f"PASS table: {table} (ACTIVE)" in out


def test_doctor_on_a_function_that_does_not_exist(moto, layer_env, table):
    done = run(doctor_env(moto, layer_env, table), "doctor", "--function", "nope")
    assert done.returncode == 1
    assert "FAIL function: could not read function 'nope': ResourceNotFoundException" in done.stdout


# -- who else the function's records are open to (issue 44: R1.5, R-M1.2) ------------------------------------

ACCOUNT = "123456789012"  # moto's


def plain_function(moto: SQSServer, name: str, variables: dict[str, str], role: str | None = None) -> str:
    """A function set up right but for what a test varies, with no event source mapping; its role's ARN."""
    if role is None:
        role = client(moto, "iam").create_role(RoleName=f"{name}-role", AssumeRolePolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "lambda.amazonaws.com"}}]}))["Role"]["Arn"]
    lam = client(moto, "lambda")
    layer = lam.list_layer_versions(LayerName="idempotency-layer-x86_64")["LayerVersions"][0]["LayerVersionArn"]
    lam.create_function(FunctionName=name, Runtime="python3.12", Role=role, Handler="app.handler",
                        Code={"ZipFile": _zip()}, Timeout=30, Layers=[layer],
                        Environment={"Variables": {"AWS_LAMBDA_EXEC_WRAPPER": WRAPPER,
                                                   "IDEMPOTENCY_KEY_JMESPATH": "orderId", **variables}})
    return role


def doctor_checks(env: dict[str, str], name: str) -> tuple[int, dict[str, Any], str]:
    done = run(env, "doctor", "--function", name)
    checks = json.loads(run(env, "doctor", "--function", name, "--json").stdout)["checks"]
    return done.returncode, {check["name"]: check for check in checks}, done.stdout


def test_doctor_warns_when_the_role_reaches_keys_outside_its_prefix(moto, deployed, layer_env, table, iam):
    role = plain_function(moto, "orders-wide", {"IDEMPOTENCY_TABLE": table})
    iam.grant(role, list(ITEM_ACTIONS), None)  # the template's statement before issue 44: no condition
    seen = len(iam.seen)
    code, checks, out = doctor_checks(doctor_env(moto, layer_env, table, iam), "orders-wide")
    assert code == 0, out  # a warning
    assert (f"WARN role isolation: the role {role} may call dynamodb:GetItem, dynamodb:PutItem, dynamodb:UpdateItem, "
            "dynamodb:DeleteItem, dynamodb:BatchGetItem on keys outside orders-wide#* (IAM's policy simulator allows "
            "them on 'zz-other#x'): it can read, forge or delete other functions' records in the table; the role "
            f"{role} may call dynamodb:GetItem, dynamodb:PutItem, dynamodb:UpdateItem, dynamodb:DeleteItem, "
            "dynamodb:BatchGetItem with no dynamodb:LeadingKeys: the Null dynamodb:LeadingKeys false guard is "
            "missing (ForAllValues holds for a request naming no key)\n"
            "     fix: confine the role's statement on the table with ForAllValues:StringLike on "
            "dynamodb:LeadingKeys ['orders-wide#*'] and Null dynamodb:LeadingKeys false, with no Scan, Query or "
            "PartiQL in it (docs/security.md)\n") in out
    asked = iam.seen[seen]  # what doctor asked IAM, field by field
    assert asked["PolicySourceArn"] == role
    assert [asked[f"ActionNames.member.{n}"] for n in range(1, 10)] == list(KEYED_ACTIONS)
    assert "ActionNames.member.10" not in asked
    assert asked["ResourceArns.member.1"] == f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/{table}"
    assert (asked["ContextEntries.member.1.ContextKeyName"], asked["ContextEntries.member.1.ContextKeyType"],
            asked["ContextEntries.member.1.ContextKeyValues.member.1"]) == (
        "dynamodb:LeadingKeys", "stringList", "zz-other#x")
    unkeyed = iam.seen[seen + 1]  # the second call: no context entry, the bulk requests too
    assert [unkeyed[f"ActionNames.member.{n}"] for n in range(1, 16)] == list(KEYED_ACTIONS + BULK_ACTIONS)
    assert not any(name.startswith("ContextEntries") for name in unkeyed)
    assert checks["role isolation"]["status"] == "WARN"

    # Confined, but with a read statement of no condition beside it: only the reads are named.
    role = plain_function(moto, "orders-reads", {"IDEMPOTENCY_TABLE": table})
    iam.grant(role, list(ITEM_ACTIONS), ["orders-reads#*"], null_guard=True)
    iam.grant(role, ["dynamodb:GetItem", "dynamodb:BatchGetItem"], None)
    _, checks, _ = doctor_checks(doctor_env(moto, layer_env, table, iam), "orders-reads")
    assert checks["role isolation"]["detail"].startswith(
        f"the role {role} may call dynamodb:GetItem, dynamodb:BatchGetItem on keys outside orders-reads#* (")


def test_doctor_warns_on_a_missing_null_guard_and_on_bulk_requests(moto, deployed, layer_env, table, iam):
    role = plain_function(moto, "orders-unguarded", {"IDEMPOTENCY_TABLE": table})
    iam.grant(role, list(ITEM_ACTIONS), ["orders-unguarded#*"])  # ForAllValues, no Null: a keyless request passes
    code, checks, out = doctor_checks(doctor_env(moto, layer_env, table, iam), "orders-unguarded")
    assert code == 0, out
    assert checks["role isolation"]["status"] == "WARN"
    assert checks["role isolation"]["detail"] == (
        f"the role {role} may call dynamodb:GetItem, dynamodb:PutItem, dynamodb:UpdateItem, dynamodb:DeleteItem, "
        "dynamodb:BatchGetItem with no dynamodb:LeadingKeys: the Null dynamodb:LeadingKeys false guard is missing "
        "(ForAllValues holds for a request naming no key)")
    role = plain_function(moto, "orders-scans", {"IDEMPOTENCY_TABLE": table})
    iam.grant(role, list(ITEM_ACTIONS), ["orders-scans#*"], null_guard=True)
    iam.grant(role, ["dynamodb:Scan", "dynamodb:PartiQLSelect"], None)
    iam.grant(role, ["dynamodb:Query"], ["orders-scans#*"])  # a Query without the key names no key: it passes
    _, checks, out = doctor_checks(doctor_env(moto, layer_env, table, iam), "orders-scans")
    assert checks["role isolation"]["detail"] == (
        f"the role {role} may call dynamodb:Scan, dynamodb:Query, dynamodb:PartiQLSelect on the table: they reach "
        "every function's records"), out
    assert "with no Scan, Query or PartiQL in it (docs/security.md)" in checks["role isolation"]["fix"]


def test_doctor_warns_on_writes_of_many_items_the_layer_never_sends(moto, deployed, layer_env, table, iam):
    # A role confined for the layer's own actions, with BatchWriteItem and a transaction of no condition beside:
    # they forge or delete other functions' records by key (a hostile review found doctor passed this role).
    role = plain_function(moto, "orders-writes", {"IDEMPOTENCY_TABLE": table})
    iam.grant(role, list(ITEM_ACTIONS), ["orders-writes#*"], null_guard=True)
    iam.grant(role, ["dynamodb:BatchWriteItem", "dynamodb:TransactWriteItems"], None)
    _, checks, out = doctor_checks(doctor_env(moto, layer_env, table, iam), "orders-writes")
    assert checks["role isolation"]["status"] == "WARN", out
    assert checks["role isolation"]["detail"].startswith(
        f"the role {role} may call dynamodb:BatchWriteItem, dynamodb:TransactWriteItems on keys outside "
        "orders-writes#* (")


def test_doctor_passes_a_role_confined_to_its_prefix(moto, deployed, layer_env, table, iam):
    role = plain_function(moto, "orders-own", {"IDEMPOTENCY_TABLE": table})
    iam.grant(role, list(ITEM_ACTIONS), ["orders-own#*"], null_guard=True)
    # the Powertools migration's read
    iam.grant(role, ["dynamodb:GetItem"], ["orders-own.app.handler#*"], null_guard=True)
    code, checks, out = doctor_checks(doctor_env(moto, layer_env, table, iam), "orders-own")
    assert code == 0, out
    assert ("PASS role isolation: the role is confined to orders-own#*: IAM's policy simulator denies every item "
            "action on 'zz-other#x' or with no leading key, and Scan, Query and PartiQL\n") in out
    assert checks["role isolation"]["status"] == "PASS"


def test_doctor_says_when_the_isolation_check_cannot_run(moto, deployed, layer_env, table, iam):
    role = plain_function(moto, "orders-unasked", {"IDEMPOTENCY_TABLE": table})
    iam.deny_callers()  # the operator may not call iam:SimulatePrincipalPolicy
    try:
        code, checks, out = doctor_checks(doctor_env(moto, layer_env, table, iam), "orders-unasked")
    finally:
        iam.deny_callers(False)
    assert code == 0, out
    assert (f"WARN role isolation: could not run: iam:SimulatePrincipalPolicy on {role} failed (AccessDenied), so "
            "whether the role can reach keys outside orders-unasked#* is not known\n"
            "     fix: run doctor with credentials that may call iam:SimulatePrincipalPolicy on the role (the "
            "function itself does not need it)\n") in out
    assert checks["permission PutItem"]["status"] == "PASS"  # the other checks still ran
    # moto's IAM, which has no SimulatePrincipalPolicy, answers what botocore cannot parse: the unreadable-answer
    # line naming the endpoint's variable (not a retry), never a crash or a traceback
    code, checks, out = doctor_checks(doctor_env(moto, layer_env, table), "orders-unasked")
    assert checks["role isolation"]["status"] == "WARN", out
    assert (checks["role isolation"]["detail"], checks["role isolation"]["fix"]) == (
        "could not run: SimulatePrincipalPolicy's answer is not one this doctor can read",
        "check the endpoint (AWS_ENDPOINT_URL_IAM / AWS_ENDPOINT_URL): it should be IAM's"), out


def test_doctor_isolation_in_the_sort_key_layout(moto, deployed, layer_env, sort_key_table, iam):
    settings = {"IDEMPOTENCY_TABLE": sort_key_table, "IDEMPOTENCY_KEY_ATTR": "pk", "IDEMPOTENCY_SORT_KEY_ATTR": "sk"}
    role = plain_function(moto, "orders-sk", settings)
    # StringEquals: a pattern without wildcards
    iam.grant(role, list(ITEM_ACTIONS), ["idempotency#orders-sk"], null_guard=True)
    seen = len(iam.seen)
    code, checks, out = doctor_checks(doctor_env(moto, layer_env, sort_key_table, iam), "orders-sk")
    assert code == 0, out
    assert iam.seen[seen]["ContextEntries.member.1.ContextKeyValues.member.1"] == "idempotency#zz-other"
    assert ("PASS role isolation: the role is confined to 'idempotency#orders-sk': IAM's policy simulator denies "
            "every item action on 'idempotency#zz-other' or with no leading key, and Scan, Query and PartiQL\n") in out
    role = plain_function(moto, "orders-sk-wide", settings)
    iam.grant(role, list(ITEM_ACTIONS), ["idempotency#*"], null_guard=True)  # every function's partition
    _, checks, out = doctor_checks(doctor_env(moto, layer_env, sort_key_table, iam), "orders-sk-wide")
    assert checks["role isolation"]["status"] == "WARN", out
    assert "on keys outside 'idempotency#orders-sk-wide' (IAM's policy simulator allows them on " \
        "'idempotency#zz-other')" in out
    assert "fix: confine the role's statement on the table with ForAllValues:StringEquals on dynamodb:LeadingKeys " \
        "['idempotency#orders-sk-wide'] and Null dynamodb:LeadingKeys false" in out


def test_doctor_warns_on_http_callers_sharing_one_scope(moto, deployed, layer_env, table, iam):
    plain_function(moto, "orders-api", {"IDEMPOTENCY_TABLE": table, "IDEMPOTENCY_KEY_HEADER": "Idempotency-Key"},
                   role=deployed["role"])
    code, checks, out = doctor_checks(doctor_env(moto, layer_env, table, iam), "orders-api")
    assert code == 0, out
    assert ("WARN http callers: the function takes HTTP requests (IDEMPOTENCY_KEY_HEADER='Idempotency-Key' is set), "
            "and IDEMPOTENCY_CALLER_HEADERS is unset: callers without an authorizer (API Gateway's authorizers are "
            "not visible here) share one scope, so one caller can be answered with another's stored response\n"
            "     fix: set IDEMPOTENCY_CALLER_HEADERS (e.g. Authorization) to the headers that name the caller, or "
            "put an authorizer in front (docs/http.md)\n") in out

    plain_function(moto, "orders-url", {"IDEMPOTENCY_TABLE": table}, role=deployed["role"])
    client(moto, "lambda").create_function_url_config(FunctionName="orders-url", AuthType="NONE")
    _, checks, out = doctor_checks(doctor_env(moto, layer_env, table, iam), "orders-url")
    assert checks["http callers"]["detail"].startswith(
        "the function takes HTTP requests (its function URL has AuthType NONE), and IDEMPOTENCY_CALLER_HEADERS is "
        "unset: callers without an authorizer share one scope"), out

    plain_function(moto, "orders-api-scoped", {"IDEMPOTENCY_TABLE": table, "IDEMPOTENCY_KEY_HEADER": "Idempotency-Key",
                                               "IDEMPOTENCY_CALLER_HEADERS": "Authorization"}, role=deployed["role"])
    code, checks, out = doctor_checks(doctor_env(moto, layer_env, table, iam), "orders-api-scoped")
    assert code == 0, out
    assert "PASS http callers: IDEMPOTENCY_CALLER_HEADERS=authorization: a request no authorizer names is scoped " \
        "by those headers\n" in out
    assert "WARN" not in out

    plain_function(moto, "orders-iam-url", {"IDEMPOTENCY_TABLE": table}, role=deployed["role"])
    client(moto, "lambda").create_function_url_config(FunctionName="orders-iam-url", AuthType="AWS_IAM")
    _, checks, out = doctor_checks(doctor_env(moto, layer_env, table, iam), "orders-iam-url")
    assert "http callers" not in checks, out  # IAM names every caller of the URL, and nothing says HTTP otherwise
