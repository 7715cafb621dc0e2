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

from tests.store.test_cli_commands import cli_env, run
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


def doctor_env(moto: SQSServer, layer_env: Any, table: str) -> dict[str, str]:
    env = cli_env(layer_env.endpoint, "not-the-functions-table")  # the function's own settings win
    env.update(AWS_ENDPOINT_URL_LAMBDA=moto.endpoint, AWS_ENDPOINT_URL_SQS=moto.endpoint)
    del env["AWS_LAMBDA_FUNCTION_NAME"]  # the function's name is the key prefix
    return env


def test_doctor_passes_a_function_set_up_right(moto, deployed, layer_env, table):
    make_function(deployed, "orders", table, good=True)
    env = doctor_env(moto, layer_env, table)
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
