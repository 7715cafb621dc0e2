"""`doctor --function`'s isolation checks as pure parts (issue 44): the role's confinement to its own keys as
IAM's policy simulator answers (R1.5), given stand-in simulators for what tests/store/test_cli_doctor_function.py
cannot make IAM answer (a timeout, a malformed answer), and the HTTP callers' scope (R-M1.2) for each hint."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError
from botocore.parsers import ResponseParserError

from idempotency_layer import config as _config
from idempotency_layer.cli.checks.dynamodb import (
    BULK_ACTIONS,
    KEYED_ACTIONS,
    isolation_check,
    isolation_request,
    outside_key,
    unkeyed_request,
)
from idempotency_layer.cli.doctor import PASS, WARN, http_callers_check

ROLE = "arn:aws:iam::123456789012:role/orders-role"
TABLE = "arn:aws:dynamodb:us-east-1:123456789012:table/orders-idem"
BASE = {"IDEMPOTENCY_TABLE": "orders-idem", "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler",
        "AWS_LAMBDA_FUNCTION_NAME": "orders"}


def settings(**extra: str) -> Any:
    return _config.load({**BASE, **extra})


def answering(keyed: dict[str, str], unkeyed: dict[str, str] | None = None) -> Any:
    """A simulator answering `keyed` to the call with a leading key, `unkeyed` (else every action denied) to the
    call without one."""
    asked: list[dict[str, Any]] = []

    def simulate(request: dict[str, Any]) -> list[dict[str, Any]]:
        asked.append(request)
        decisions = keyed if "ContextEntries" in request else (
            unkeyed or {action: "implicitDeny" for action in KEYED_ACTIONS + BULK_ACTIONS})
        return [{"EvalActionName": action, "EvalResourceName": TABLE, "EvalDecision": decision}
                for action, decision in decisions.items()]

    simulate.asked = asked  # type: ignore[attr-defined]
    return simulate


def test_the_request_asks_about_a_key_outside_the_prefix():
    assert isolation_request(settings(), ROLE, TABLE) == {
        "PolicySourceArn": ROLE, "ActionNames": ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
                                                 "dynamodb:DeleteItem", "dynamodb:BatchGetItem",
                                                 "dynamodb:BatchWriteItem", "dynamodb:TransactWriteItems",
                                                 "dynamodb:TransactGetItems", "dynamodb:ConditionCheckItem"],
        "ResourceArns": [TABLE],
        "ContextEntries": [{"ContextKeyName": "dynamodb:LeadingKeys", "ContextKeyValues": ["zz-other#x"],
                            "ContextKeyType": "stringList"}]}


@pytest.mark.parametrize(("extra", "other"), [
    ({}, "zz-other#x"),
    ({"IDEMPOTENCY_KEY_PREFIX": "zz-other"}, "zz-another#x"),  # never a key of the function itself
    ({"IDEMPOTENCY_SORT_KEY_ATTR": "sk"}, "idempotency#zz-other"),  # another function's partition value
    ({"IDEMPOTENCY_SORT_KEY_ATTR": "sk", "IDEMPOTENCY_PARTITION_VALUE": "idempotency#zz-other"},
     "idempotency#zz-another"),
])
def test_the_outside_key_is_never_the_functions_own(extra, other):
    config = settings(**extra)
    assert outside_key(config)[0] == other
    if config.partition_value is None:
        assert not other.startswith(f"{config.key_prefix}#")
    else:
        assert other != config.partition_value


def test_the_second_request_names_no_key_and_asks_about_bulk_requests():
    assert unkeyed_request(ROLE, TABLE) == {
        "PolicySourceArn": ROLE, "ActionNames": [
            "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem",
            "dynamodb:BatchGetItem", "dynamodb:BatchWriteItem", "dynamodb:TransactWriteItems",
            "dynamodb:TransactGetItems", "dynamodb:ConditionCheckItem", "dynamodb:Scan", "dynamodb:Query",
            "dynamodb:PartiQLSelect",
            "dynamodb:PartiQLInsert", "dynamodb:PartiQLUpdate", "dynamodb:PartiQLDelete"],
        "ResourceArns": [TABLE]}


def test_a_missing_null_guard_and_bulk_requests_are_warnings():
    denied = {action: "implicitDeny" for action in KEYED_ACTIONS + BULK_ACTIONS}
    guardless = answering({a: "implicitDeny" for a in KEYED_ACTIONS}, {**denied, "dynamodb:PutItem": "allowed"})
    check = isolation_check(guardless, settings(), ROLE, TABLE)
    assert (check.status, check.detail) == (WARN, f"the role {ROLE} may call dynamodb:PutItem with no "
                                            "dynamodb:LeadingKeys: the Null dynamodb:LeadingKeys false guard is "
                                            "missing (ForAllValues holds for a request naming no key)")
    bulk = answering({a: "implicitDeny" for a in KEYED_ACTIONS},
                     {**denied, "dynamodb:Scan": "allowed", "dynamodb:PartiQLDelete": "allowed"})
    check = isolation_check(bulk, settings(), ROLE, TABLE)
    assert (check.status, check.detail) == (WARN, f"the role {ROLE} may call dynamodb:Scan, dynamodb:PartiQLDelete "
                                            "on the table: they reach every function's records")
    assert check.fix == ("confine the role's statement on the table with ForAllValues:StringLike on "
                         "dynamodb:LeadingKeys ['orders#*'] and Null dynamodb:LeadingKeys false, with no Scan, "
                         "Query or PartiQL in it (docs/security.md)")
    every = answering({**{a: "implicitDeny" for a in KEYED_ACTIONS}, "dynamodb:GetItem": "allowed"},
                      {**denied, "dynamodb:GetItem": "allowed", "dynamodb:Query": "allowed"})
    assert isolation_check(every, settings(), ROLE, TABLE).detail.count(f"the role {ROLE} may call") == 3
    # an unkeyed answer missing a bulk action is not read as a denial
    short = answering({a: "implicitDeny" for a in KEYED_ACTIONS}, {a: "implicitDeny" for a in KEYED_ACTIONS})
    assert isolation_check(short, settings(), ROLE, TABLE).detail.startswith("could not run: SimulatePrincipal")


def test_each_decision():
    denied = answering({action: "implicitDeny" for action in KEYED_ACTIONS})
    check = isolation_check(denied, settings(), ROLE, TABLE)
    assert check == (  # (Check's fix is None)
        "role isolation", PASS, "the role is confined to orders#*: IAM's policy simulator denies every item action "
        "on 'zz-other#x' or with no leading key, and Scan, Query and PartiQL", None)
    assert denied.asked == [isolation_request(settings(), ROLE, TABLE), unkeyed_request(ROLE, TABLE)]
    explicit = answering({**{action: "implicitDeny" for action in KEYED_ACTIONS},
                          "dynamodb:DeleteItem": "explicitDeny"})
    assert isolation_check(explicit, settings(), ROLE, TABLE).status == PASS
    one = answering({**{action: "implicitDeny" for action in KEYED_ACTIONS}, "dynamodb:DeleteItem": "allowed"})
    check = isolation_check(one, settings(), ROLE, TABLE)
    assert check.status == WARN
    assert check.detail.startswith(f"the role {ROLE} may call dynamodb:DeleteItem on keys outside orders#* (")
    assert check.fix.endswith("(docs/security.md)")


@pytest.mark.parametrize(("answer", "said"), [
    ([], "could not run: SimulatePrincipalPolicy's answer is not one this doctor can read"),  # no results
    ([{"EvalActionName": "dynamodb:GetItem"}], "could not run: SimulatePrincipalPolicy's answer is not one"),
    ([{"EvalActionName": action, "EvalDecision": "allowed"} for action in KEYED_ACTIONS[:4]],  # one missing
     "could not run: SimulatePrincipalPolicy's answer is not one"),
    (["allowed"], "could not run: SimulatePrincipalPolicy's answer is not one"),
    ([{"EvalActionName": action, "EvalDecision": None} for action in KEYED_ACTIONS],
     "could not run: SimulatePrincipalPolicy's answer is not one"),
])
def test_a_malformed_answer_is_a_warning(answer, said):
    check = isolation_check(lambda request: answer, settings(), ROLE, TABLE)
    assert (check.status, check.detail[:len(said)]) == (WARN, said)
    assert check.fix == "check the endpoint (AWS_ENDPOINT_URL_IAM / AWS_ENDPOINT_URL): it should be IAM's"


def test_an_answer_botocore_cannot_parse_names_the_endpoint():
    def simulate(request: dict[str, Any]) -> list[Any]:
        raise ResponseParserError("Unable to parse response (not well-formed (invalid token)), invalid XML received")

    check = isolation_check(simulate, settings(), ROLE, TABLE)
    assert check == ("role isolation", WARN, "could not run: SimulatePrincipalPolicy's answer is not one this doctor "
                     "can read", "check the endpoint (AWS_ENDPOINT_URL_IAM / AWS_ENDPOINT_URL): it should be IAM's")


@pytest.mark.parametrize(("error", "code", "fix"), [
    (ClientError({"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}},
                 "SimulatePrincipalPolicy"), "AccessDenied", "run doctor with credentials that may call "
     "iam:SimulatePrincipalPolicy on the role (the function itself does not need it)"),
    (ClientError({"Error": {"Code": "NoSuchEntity"}, "ResponseMetadata": {"HTTPStatusCode": 404}},
                 "SimulatePrincipalPolicy"), "NoSuchEntity", "run doctor with credentials that may call "
     "iam:SimulatePrincipalPolicy on the role (the function itself does not need it)"),
    (ReadTimeoutError(endpoint_url="https://iam.amazonaws.com"), "ReadTimeoutError",
     "IAM did not answer; retry doctor"),
    (TimeoutError("not done within 30.00 s"), "TimeoutError", "IAM did not answer; retry doctor"),
])
def test_a_failed_simulation_is_a_warning_naming_the_permission(error, code, fix):
    def simulate(request: dict[str, Any]) -> list[Any]:
        raise error

    check = isolation_check(simulate, settings(), ROLE, TABLE)
    assert check == ("role isolation", WARN, f"could not run: iam:SimulatePrincipalPolicy on {ROLE} failed "
                     f"({code}), so whether the role can reach keys outside orders#* is not known", fix)


def test_http_callers_for_each_hint():
    header = {"IDEMPOTENCY_KEY_HEADER": "Idempotency-Key"}
    assert http_callers_check(settings(), {}, None) is None  # nothing says the function takes HTTP requests
    assert http_callers_check(settings(), {}, "AWS_IAM") is None  # IAM names each caller of the URL
    assert http_callers_check(settings(IDEMPOTENCY_HTTP="off", **header), header, "NONE") is None
    warned = http_callers_check(settings(**header), header, None)
    assert warned is not None and warned.status == WARN
    assert warned.detail == (
        "the function takes HTTP requests (IDEMPOTENCY_KEY_HEADER='Idempotency-Key' is set), and "
        "IDEMPOTENCY_CALLER_HEADERS is unset: callers without an authorizer (API Gateway's authorizers are not "
        "visible here) share one scope, so one caller can be answered with another's stored response")
    assert warned.fix == ("set IDEMPOTENCY_CALLER_HEADERS (e.g. Authorization) to the headers that name the caller, "
                          "or put an authorizer in front (docs/http.md)")
    both = http_callers_check(settings(**header), header, "NONE")
    assert both is not None and both.detail.startswith(
        "the function takes HTTP requests (its function URL has AuthType NONE; IDEMPOTENCY_KEY_HEADER="
        "'Idempotency-Key' is set), and IDEMPOTENCY_CALLER_HEADERS is unset: callers without an authorizer share")
    scoped = http_callers_check(settings(IDEMPOTENCY_CALLER_HEADERS="Authorization, Cookie"), {}, "NONE")
    assert scoped == ("http callers", PASS, "IDEMPOTENCY_CALLER_HEADERS=authorization,cookie: a request no "
                      "authorizer names is scoped by those headers", None)


def test_a_write_of_many_items_on_other_keys_is_a_warning():
    # BatchWriteItem and the transactions are no request of the layer's, but they forge or delete records by key.
    denied = {action: "implicitDeny" for action in KEYED_ACTIONS + BULK_ACTIONS}
    check = isolation_check(answering({**denied, "dynamodb:BatchWriteItem": "allowed"}, denied), settings(), ROLE,
                            TABLE)
    assert check.status == "WARN" and "dynamodb:BatchWriteItem on keys outside orders#*" in check.detail
