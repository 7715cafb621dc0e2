"""`doctor --function NAME` on a function whose SQS mapping has no ReportBatchItemFailures: a FAIL naming both fixes
under IDEMPOTENCY_BATCH_RESPONSE=partial, a PASS under `fail`, which needs no partial batch response (issue 23).
Against moto's server for Lambda and SQS and DynamoDB Local for the table, the CLI run as a subprocess."""

from __future__ import annotations

import json

import pytest

from tests.store.test_cli_commands import run
from tests.store.test_cli_doctor_function import WRAPPER, _zip, deployed, doctor_env  # noqa: F401  (the fixture)


@pytest.mark.parametrize("setting", ["partial", "fail"])
def test_doctor_accepts_batch_response_fail_in_place_of_report_batch_item_failures(
        moto, deployed, layer_env, table, setting):  # noqa: F811
    name = f"orders-{setting}"
    lam = deployed["lambda"]
    lam.create_function(FunctionName=name, Runtime="python3.12", Role=deployed["role"], Handler="app.handler",
                        Code={"ZipFile": _zip()}, Timeout=30, Layers=[deployed["layer"]],
                        Environment={"Variables": {"IDEMPOTENCY_TABLE": table, "AWS_LAMBDA_EXEC_WRAPPER": WRAPPER,
                                                   "IDEMPOTENCY_BATCH_RESPONSE": setting}})
    lam.create_event_source_mapping(FunctionName=name, EventSourceArn=deployed["good_queue"], BatchSize=10)
    done = run(doctor_env(moto, layer_env, table), "doctor", "--function", name, "--json")
    checks = json.loads(done.stdout)["checks"]
    first = next(check for check in checks if check["name"].startswith("mapping"))
    if setting == "fail":
        assert done.returncode == 0, checks
        assert first["status"] == "PASS" and "IDEMPOTENCY_BATCH_RESPONSE=fail" in first["detail"]
    else:
        assert done.returncode == 1
        assert first["status"] == "FAIL" and "ReportBatchItemFailures is off" in first["detail"]
        assert "IDEMPOTENCY_BATCH_RESPONSE=fail" in first["fix"]
