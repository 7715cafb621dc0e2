"""doctor's probe of dynamodb:BatchGetItem (issue 23 part 4): only a batch's pre-check needs it, and the layer
works without it, so a role without it is a warning with its fix, never a failure (except under --strict)."""

from __future__ import annotations

from tests.store.test_cli_commands import Denying, cli_env, doctor


def test_a_role_without_batchgetitem_is_a_warning_with_its_fix(layer_env, table, ddb_client):
    with Denying(layer_env.endpoint, "BatchGetItem") as proxy:
        env = {**cli_env(proxy.endpoint, table), "AWS_LAMBDA_EXEC_WRAPPER": "/opt/idempotency-wrapper",
               "IDEMPOTENCY_KEY_JMESPATH": "orderId"}
        status, checks, text = doctor(env)
        strict, _, _ = doctor(env, "--strict")
    assert "BatchGetItem" in proxy.seen
    assert status == 0 and strict == 1
    assert checks["permission BatchGetItem"]["status"] == "WARN"
    assert all(checks[f"permission {op}"]["status"] == "PASS" for op in ("PutItem", "UpdateItem", "GetItem",
                                                                          "DeleteItem"))
    assert "WARN permission BatchGetItem: AccessDeniedException on probe key orders#doctor-probe-" in text
    assert f"fix: grant the function's role dynamodb:BatchGetItem on table '{table}'" in text
    assert "0 failed, 1 warning(s), 11 passed" in text
    left = ddb_client.scan(TableName=table, ConsistentRead=True)["Items"]
    assert not [item for item in left if item["id"]["S"].startswith("orders#doctor-probe-")]  # probes removed


def test_a_throttled_batchgetitem_probe_proves_nothing_and_blames_no_permission(layer_env, table):
    with Denying(layer_env.endpoint, "BatchGetItem", error=(400, "ThrottlingException")) as proxy:
        status, checks, _ = doctor(cli_env(proxy.endpoint, table))
    assert status == 0
    assert checks["permission BatchGetItem"]["status"] == "WARN"
    assert "could not be proven (ThrottlingException)" in checks["permission BatchGetItem"]["detail"]
    assert "grant" not in (checks["permission BatchGetItem"]["fix"] or "")
