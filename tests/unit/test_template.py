"""template.yaml: cfn-lint clean, least-privilege IAM, and the environment the layer needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode import cfn_yaml

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
RUNTIMES = ["python3.10", "python3.11", "python3.12", "python3.13", "python3.14"]
ACTIONS = {"dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"}
BATCH_ACTIONS = ACTIONS | {"dynamodb:BatchGetItem"}  # a function fed batches: the pre-check's one read


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return cfn_yaml.load(str(TEMPLATE))


def resource_of_type(template: dict[str, Any], type_: str, **props: Any) -> tuple[str, dict[str, Any]]:
    found = [
        (name, r["Properties"])
        for name, r in template["Resources"].items()
        if r["Type"] == type_ and all(r["Properties"].get(k) == v for k, v in props.items())
    ]
    assert len(found) == 1, f"want exactly one {type_} with {props}, found {[n for n, _ in found]}"
    return found[0]


def table_name(template: dict[str, Any]) -> str:
    return resource_of_type(template, "AWS::DynamoDB::Table")[0]


def attached_function(template: dict[str, Any], code: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The function of example `code` (its name, properties and environment), checked to run under the layer: the
    x86_64 layer attached, the wrapper set and the template's table named."""
    name, fn = resource_of_type(template, "AWS::Serverless::Function", CodeUri=code)
    x86_layer, _ = resource_of_type(template, "AWS::Serverless::LayerVersion", CompatibleArchitectures=["x86_64"])
    assert fn["Layers"] == [{"Ref": x86_layer}]
    env = fn["Environment"]["Variables"]
    assert env["AWS_LAMBDA_EXEC_WRAPPER"] == "/opt/idempotency-wrapper"
    assert env["IDEMPOTENCY_TABLE"] == {"Ref": table_name(template)}
    return name, fn, env


def cfn_lint(path: Path) -> None:
    """cfn-lint finds nothing in `path`: the console script beside this interpreter (the venv's), else
    whichever is on PATH."""
    beside = Path(sys.executable).with_name("cfn-lint")
    found = str(beside) if beside.exists() else shutil.which("cfn-lint")
    assert found, "cfn-lint not installed"
    proc = subprocess.run([found, str(path)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cfn_lint_passes() -> None:
    cfn_lint(TEMPLATE)


@pytest.mark.parametrize("arch", ["x86_64", "arm64"])
def test_layer_per_architecture(template: dict[str, Any], arch: str) -> None:
    _, props = resource_of_type(template, "AWS::Serverless::LayerVersion", CompatibleArchitectures=[arch])
    assert props["ContentUri"] == f"dist/idempotency-layer-{arch}.zip"
    assert props["CompatibleRuntimes"] == RUNTIMES


def test_table(template: dict[str, Any]) -> None:
    _, props = resource_of_type(template, "AWS::DynamoDB::Table")
    assert props["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]
    assert props["AttributeDefinitions"] == [{"AttributeName": "id", "AttributeType": "S"}]
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert props["SSESpecification"]["SSEEnabled"] is True


def functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: r["Properties"] for name, r in template["Resources"].items()
            if r["Type"] == "AWS::Serverless::Function"}


def test_function_environment_and_layer(template: dict[str, Any]) -> None:
    _, fn, env = attached_function(template, "examples/orders/")
    assert (fn["Handler"], fn["Runtime"]) == ("app.handler", "python3.12")
    assert env["IDEMPOTENCY_KEY_JMESPATH"] == "orderId"


def test_queue_consumer_reports_batch_item_failures_and_has_a_dead_letter_queue(template: dict[str, Any]) -> None:
    _, fn, env = attached_function(template, "examples/shipments/")
    assert fn["Handler"] == "app.handler"
    assert "IDEMPOTENCY_KEY_JMESPATH" not in env and "IDEMPOTENCY_SCOPE" not in env  # per message by default
    (event,) = fn["Events"].values()
    assert event["Type"] == "SQS"
    props = event["Properties"]
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert 1 <= props["BatchSize"] <= 10
    queue = template["Resources"][props["Queue"]["Fn::GetAtt"][0]]
    assert queue["Type"] == "AWS::SQS::Queue"
    assert queue["Properties"]["VisibilityTimeout"] >= 6 * fn["Timeout"]  # AWS's advice for Lambda consumers
    redrive = queue["Properties"]["RedrivePolicy"]
    dead_letter = template["Resources"][redrive["deadLetterTargetArn"]["Fn::GetAtt"][0]]
    assert dead_letter["Type"] == "AWS::SQS::Queue" and redrive["maxReceiveCount"] >= 1


@pytest.mark.parametrize("code", ["examples/orders/", "examples/shipments/", "examples/orders_api/"])
def test_iam_is_exactly_the_item_actions_on_the_table(template: dict[str, Any], code: str) -> None:
    _, fn = resource_of_type(template, "AWS::Serverless::Function", CodeUri=code)
    policies = fn["Policies"]
    # Inline statements only: no managed policy names, no SAM policy templates.
    assert all(isinstance(p, dict) and set(p) == {"Version", "Statement"} for p in policies), policies
    statements = [s for p in policies for s in p["Statement"]]
    assert len(statements) == 1, statements
    (stmt,) = statements
    assert stmt["Effect"] == "Allow"
    expected = BATCH_ACTIONS if code == "examples/shipments/" else ACTIONS
    assert isinstance(stmt["Action"], list) and len(stmt["Action"]) == len(expected)
    assert set(stmt["Action"]) == expected
    # cfn-lint does not catch a GetAtt on a misspelled resource here, so check it names the table.
    table = table_name(template)
    assert stmt["Resource"] in ({"Fn::GetAtt": [table, "Arn"]}, {"Fn::GetAtt": f"{table}.Arn"})


def test_every_function_is_one_of_the_examples(template: dict[str, Any]) -> None:
    assert sorted(fn["CodeUri"] for fn in functions(template).values()) == [
        "examples/kafka_orders/", "examples/orders/", "examples/orders_api/", "examples/shipments/"]


def test_http_function_sits_behind_an_http_api_with_the_header_configured(template: dict[str, Any]) -> None:
    _, fn, env = attached_function(template, "examples/orders_api/")
    assert env["IDEMPOTENCY_KEY_HEADER"] == "Idempotency-Key"
    (event,) = fn["Events"].values()
    assert event["Type"] == "HttpApi" and event["Properties"]["PayloadFormatVersion"] == "2.0"


def test_outputs(template: dict[str, Any]) -> None:
    values = [o["Value"] for o in template["Outputs"].values()]
    layers = [
        resource_of_type(template, "AWS::Serverless::LayerVersion", CompatibleArchitectures=[a])[0]
        for a in ("x86_64", "arm64")
    ]
    assert {"Ref": table_name(template)} in values
    for layer in layers:
        assert {"Ref": layer} in values


def test_every_function_declares_the_endpoint_override_empty(template: dict[str, Any]) -> None:
    # SAM's --env-vars only overrides variables the template declares: undeclared, a local run would
    # silently reach real DynamoDB.
    for name, fn in functions(template).items():
        assert fn["Environment"]["Variables"].get("AWS_ENDPOINT_URL_DYNAMODB") == "", name


def test_kafka_consumer_has_a_provisioned_mapping_reporting_batch_item_failures(template: dict[str, Any]) -> None:
    name, fn, env = attached_function(template, "examples/kafka_orders/")
    assert fn["Handler"] == "app.handler"
    # Keyed by the order inside the record's value: a producer's duplicate (another offset) charges once.
    assert env["IDEMPOTENCY_KEY_JMESPATH"] == "powertools_json(powertools_base64(value)).orderId"
    assert "IDEMPOTENCY_SCOPE" not in env
    (mapping_name, mapping), = [(n, r) for n, r in template["Resources"].items()
                                if r["Type"] == "AWS::Lambda::EventSourceMapping"]
    props = mapping["Properties"]
    assert props["FunctionName"] == {"Ref": name}
    # Kafka honours batchItemFailures only with both; without them the reported records are lost.
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    pollers = props["ProvisionedPollerConfig"]
    assert 1 <= pollers["MinimumPollers"] <= pollers["MaximumPollers"]
    assert "KafkaBootstrapServers" in props["SelfManagedEventSource"]["Endpoints"] or "EventSourceArn" in props
    # The example exists only when a cluster is given: the function and its mapping share the condition.
    condition = template["Resources"][name].get("Condition")
    assert condition and template["Resources"][mapping_name].get("Condition") == condition
    # Its table statement is the SQS consumer's but for the key prefix (least privilege on the table: the
    # prefixes' policy is tests/unit/test_policies.py's); beyond it, only the secret the mapping reads.
    _, shipments = resource_of_type(template, "AWS::Serverless::Function", CodeUri="examples/shipments/")
    statements = [s for p in fn["Policies"] for s in p["Statement"]]
    theirs = shipments["Policies"][0]["Statement"][0]
    assert {k: v for k, v in statements[0].items() if k != "Condition"} == {
        k: v for k, v in theirs.items() if k != "Condition"}
    assert [(s["Action"], s["Resource"]) for s in statements[1:]] == [
        ("secretsmanager:GetSecretValue", {"Ref": "KafkaSecretArn"})]


def test_the_valkey_example_is_cfn_lint_clean_and_points_the_function_at_its_cluster() -> None:
    path = ROOT / "examples" / "valkey" / "template.yaml"
    cfn_lint(path)
    valkey = cfn_yaml.load(str(path))
    _, cluster = resource_of_type(valkey, "AWS::MemoryDB::Cluster")
    assert cluster["TLSEnabled"] is True and "ParameterGroupName" not in cluster  # the default: noeviction
    _, fn = resource_of_type(valkey, "AWS::Serverless::Function", CodeUri="../orders/")
    env = fn["Environment"]["Variables"]
    assert env["IDEMPOTENCY_STORE"] == "valkey" and "IDEMPOTENCY_TABLE" not in env
    # The user named, its password read from the secret (the function may read that one secret only), none in
    # the environment.
    assert env["IDEMPOTENCY_VALKEY_URL"]["Fn::Sub"].startswith("rediss://orders@${Cache.")
    secret, _ = resource_of_type(valkey, "AWS::SecretsManager::Secret")
    assert env["IDEMPOTENCY_VALKEY_SECRET"] == {"Ref": secret}
    (grant,) = [s for p in fn["Policies"] for s in p["Statement"]]
    assert (grant["Action"], grant["Resource"]) == ("secretsmanager:GetSecretValue", {"Ref": secret})
    _, user = resource_of_type(valkey, "AWS::MemoryDB::User")
    assert user["AuthenticationMode"]["Passwords"] == [
        {"Fn::Sub": "{{resolve:secretsmanager:${" + secret + "}:SecretString:password}}"}]
    parts = user["AccessString"].split()
    assert [p for p in parts if p.startswith("~")] == [f"~{env['IDEMPOTENCY_KEY_PREFIX']}#*"]  # its keys only
    # Exactly the ACL tests/store/test_valkey_store.py runs the layer as.
    assert " ".join(parts[1:]) == (
        "resetkeys ~orders#* resetchannels -@all +evalsha +eval +info +cluster|slots +asking +exists +hmget +hgetall "
        "+hget +hset +hdel +del +expire")


def test_the_large_results_example_has_the_lifecycle_rule_and_its_own_object_prefix() -> None:
    path = ROOT / "examples" / "large-results" / "template.yaml"
    cfn_lint(path)
    large = cfn_yaml.load(str(path))
    _, s3 = resource_of_type(large, "AWS::S3::Bucket")
    (rule,) = s3["LifecycleConfiguration"]["Rules"]
    assert (rule["Status"], rule["Prefix"], rule["ExpirationInDays"]) == ("Enabled", "idempotency-results/", 1)
    _, fn = resource_of_type(large, "AWS::Serverless::Function", CodeUri="../orders_api/")
    env = fn["Environment"]["Variables"]
    # Under the rule's prefix, the function's own: the default for its IDEMPOTENCY_KEY_PREFIX, spelled out.
    assert env["IDEMPOTENCY_LARGE_RESULTS_PREFIX"] == f"idempotency-results/{env['IDEMPOTENCY_KEY_PREFIX']}/"
    statements = fn["Policies"][0]["Statement"]
    objects = [(s["Action"], s["Resource"]["Fn::Sub"]) for s in statements if str(s["Action"]).startswith("s3:")]
    own = "${ResultsBucket.Arn}/idempotency-results/orders-api/*"
    assert objects == [("s3:PutObject", own), ("s3:GetObject", own)]  # no DeleteObject: purge is the operator's
