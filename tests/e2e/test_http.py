"""HTTP sources end to end: the built layer under RIE + awslambdaric, an unmodified HTTP handler (apps/web.py),
events shaped as API Gateway REST, HTTP API, Function URLs and ALB send them; executions counted from the
handler's own side effect."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.e2e.conftest import Environments, Executions, marker
from tests.support import http_events
from tests.support.rie import Invocation

WEB = "web.handler"
KEY = "8e03978e-40d5-43e8-bc93-6894a57f9324"


def web(environments: Environments, version: str, table: str, env: dict[str, str] | None = None, index: int = 0):
    return environments.shared(version, table, env, index=index, handler=WEB)


def request(form: str, key: str | None, body: dict[str, Any], **options: Any) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    text = json.dumps(body)
    if form == "rest":
        return http_events.rest("POST", "/orders", headers, text, **options)
    if form == "v2":
        return http_events.v2("POST", "/orders", headers, text, **options)
    if form == "url":
        return http_events.v2("POST", "/orders", headers, text, function_url=True, **options)
    return http_events.alb("POST", "/orders", headers, text, multi=form == "alb-multi", **options)


def headers_of(response: dict[str, Any]) -> dict[str, str]:
    found = {k.lower(): v for k, v in (response.get("headers") or {}).items()}
    found.update({k.lower(): v[-1] for k, v in (response.get("multiValueHeaders") or {}).items()})
    return found


def answer(invocation: Invocation) -> dict[str, Any]:
    assert invocation.status == 200 and invocation.error_type is None, invocation.body
    return invocation.json()


FORMS = ["rest", "v2", "url", "alb", "alb-multi"]


@pytest.mark.parametrize("form", FORMS)
def test_a_retry_replays_marked_and_another_body_is_422(form: str, primary: str, environments: Environments,
                                                         shared_table: str, executions: Executions) -> None:
    env = web(environments, primary, shared_table)
    mark = marker()
    key = f'"{mark}"'
    first = answer(env.invoke(request(form, key, {"marker": mark})))
    assert first["statusCode"] == 201 and "idempotent-replayed" not in headers_of(first)
    again = answer(env.invoke(request(form, key, {"marker": mark})))  # new request id and time: a retry
    assert again["statusCode"] == 201 and again["body"] == first["body"]
    assert headers_of(again)["idempotent-replayed"] == "true"
    if form == "alb-multi":
        assert again["multiValueHeaders"]["Idempotent-Replayed"] == ["true"]
    other = answer(env.invoke(request(form, key, {"marker": mark, "amount": 2})))
    assert other["statusCode"] == 422
    assert headers_of(other)["content-type"] == "application/problem+json"
    assert json.loads(other["body"])["status"] == 422
    assert "its method, path, query or body differ" in json.loads(other["body"])["detail"]
    assert executions.count(mark) == 1


@pytest.mark.parametrize(("raw", "ok"), [(KEY, True), ('"quoted"', True), ('"unterminated', False),
                                         ("two words", False), ('"' + "x" * 256 + '"', False)])
def test_header_values(raw: str, ok: bool, primary: str, environments: Environments, shared_table: str,
                       executions: Executions) -> None:
    env = web(environments, primary, shared_table)
    mark = marker()
    event = request("v2", raw if raw != KEY else f"{mark}-{KEY}", {"marker": mark})
    event["headers"]["IDEMPOTENCY-KEY"] = event["headers"].pop("idempotency-key")  # any case
    response = answer(env.invoke(event))
    assert response["statusCode"] == (201 if ok else 400), response
    assert executions.count(mark) == (1 if ok else 0)


def test_no_header_runs_unguarded_or_is_400_when_required(primary: str, environments: Environments,
                                                           shared_table: str, executions: Executions) -> None:
    mark = marker()
    lenient = web(environments, primary, shared_table)
    for _ in range(2):
        assert answer(lenient.invoke(request("v2", None, {"marker": mark})))["statusCode"] == 201
    assert executions.count(mark) == 2  # the whole-event key never applies to HTTP events
    strict = web(environments, primary, shared_table, {"IDEMPOTENCY_REQUIRE_KEY": "true"})
    response = answer(strict.invoke(request("rest", None, {"marker": mark})))
    assert response["statusCode"] == 400 and "Idempotency-Key" in json.loads(response["body"])["detail"]
    assert executions.count(mark) == 2


def test_a_5xx_is_not_stored(primary: str, environments: Environments, shared_table: str,
                             executions: Executions) -> None:
    env = web(environments, primary, shared_table)
    mark = marker()
    for _ in range(2):
        assert answer(env.invoke(request("v2", mark, {"marker": mark, "status": 503})))["statusCode"] == 503
    assert executions.count(mark) == 2


def test_callers_never_share_a_key(primary: str, environments: Environments, shared_table: str,
                                   executions: Executions) -> None:
    env = web(environments, primary, shared_table)
    mark = marker()
    for sub in ("alice", "bob", "alice"):
        answer(env.invoke(request("v2", mark, {"marker": mark}, sub=sub)))
    assert executions.count(mark) == 2
    for principal in ("p-1", "p-2"):
        answer(env.invoke(request("rest", mark + "r", {"marker": mark}, principal=principal)))
    assert executions.count(mark) == 4


def test_a_bare_payload_2_response_is_replayed_in_the_explicit_form(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = web(environments, primary, shared_table)
    mark = marker()
    first = answer(env.invoke(request("v2", mark, {"marker": mark, "plain": True})))
    assert "statusCode" not in first and first["marker"] == mark
    again = answer(env.invoke(request("v2", mark, {"marker": mark, "plain": True})))
    assert again["statusCode"] == 200 and json.loads(again["body"]) == first
    assert headers_of(again) == {"content-type": "application/json", "idempotent-replayed": "true"}
    assert executions.count(mark) == 1


class Held(NamedTuple):
    envs: list[Any]  # two warm environments; the first is running the request
    mark: str
    body: dict[str, Any]  # the request's body; the handler waits for `release` to exist
    release: Path
    answers: dict[str, Invocation]  # "first": the held request's answer, once it came
    first: threading.Thread


def _hold_first(environments: Environments, version: str, table: str, settings: dict[str, str], index: int,
                executions: Executions, tmp_path: Path, form: str) -> Held:
    """Two warm environments with `settings`; the first is inside the handler for a request it holds."""
    envs = [web(environments, version, table, settings, index=index + i) for i in range(2)]
    for env in envs:
        answer(env.invoke(request("v2", None, {"marker": marker()})))  # warm
    mark = marker()
    release = tmp_path / "release"
    body = {"marker": mark, "release": str(release)}
    answers: dict[str, Invocation] = {}
    first = threading.Thread(target=lambda: answers.update(first=envs[0].invoke(request(form, mark, body))))
    first.start()
    executions.wait_for(mark, 1)
    return Held(envs, mark, body, release, answers, first)


@pytest.mark.parametrize("wait", ["0", "30"])
def test_a_concurrent_duplicate_is_409_or_with_waiting_the_replay(
        wait: str, primary: str, environments: Environments, shared_table: str, executions: Executions,
        tmp_path: Path) -> None:
    held = _hold_first(environments, primary, shared_table, {"IDEMPOTENCY_WAIT_SECONDS": wait}, 30, executions,
                       tmp_path, "v2")
    envs, mark, body, release, answers, first = held
    if wait == "0":
        duplicate = answer(envs[1].invoke(request("v2", mark, body)))
        release.touch()
        assert duplicate["statusCode"] == 409 and int(headers_of(duplicate)["retry-after"]) >= 1
    else:
        second = threading.Thread(target=lambda: answers.update(copy=envs[1].invoke(request("v2", mark, body))))
        second.start()
        threading.Timer(0.5, release.touch).start()
        second.join(60)
        duplicate = answer(answers["copy"])
        assert duplicate["statusCode"] == 201 and headers_of(duplicate)["idempotent-replayed"] == "true"
    first.join(60)
    assert answer(answers["first"])["statusCode"] == 201
    assert executions.count(mark) == 1


def test_requests_on_the_wire_for_http(primary: str, wired_env: Any) -> None:
    with wired_env(primary, WEB) as (env, proxy):
        answer(env.invoke(request("v2", marker(), {"marker": marker()})))  # warm: init's table check
        mark = marker()
        proxy.reset()
        answer(env.invoke(request("v2", mark, {"marker": mark})))
        # the claim, the read of the request's previous key (IDEMPOTENCY_HTTP_PREVIOUS_KEYS=consult), the completion
        assert proxy.snapshot()[0] == {"PutItem": 1, "GetItem": 1, "UpdateItem": 1}
        proxy.reset()
        assert headers_of(answer(env.invoke(request("v2", mark, {"marker": mark}))))["idempotent-replayed"]
        assert proxy.snapshot()[0] == {"PutItem": 1}  # a replay is one request
        proxy.reset()
        assert answer(env.invoke(request("v2", mark, {"marker": mark, "x": 1})))["statusCode"] == 422
        assert proxy.snapshot()[0] == {"PutItem": 1}  # so is a mismatch
        proxy.reset()
        assert answer(env.invoke(request("v2", "bad key", {"marker": mark})))["statusCode"] == 400
        assert proxy.snapshot()[0] == {}  # a malformed header costs nothing


def test_a_replay_of_a_result_too_large_to_store_is_500(primary: str, environments: Environments, shared_table: str,
                                                        executions: Executions) -> None:
    env = web(environments, primary, shared_table)
    mark = marker()
    first = answer(env.invoke(request("v2", mark, {"marker": mark, "big": 500_000})))
    assert first["statusCode"] == 201
    again = answer(env.invoke(request("v2", mark, {"marker": mark, "big": 500_000})))
    assert again["statusCode"] == 500 and "too large" in json.loads(again["body"])["detail"]
    assert executions.count(mark) == 1


def test_an_unreachable_table_is_503_with_retry_after(primary: str, make_env: Any, shared_table: str,
                                                      executions: Executions) -> None:
    import socket

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    env = make_env(primary, shared_table, {"AWS_ENDPOINT_URL_DYNAMODB": f"http://127.0.0.1:{dead}",
                                           "IDEMPOTENCY_MAX_ATTEMPTS": "1", "IDEMPOTENCY_CONNECT_TIMEOUT": "0.2"},
                   handler=WEB)
    mark = marker()
    response = answer(env.invoke(request("alb", mark, {"marker": mark})))
    assert response["statusCode"] == 503 and response["statusDescription"] == "503 Service Unavailable"
    assert headers_of(response)["retry-after"] == "1"
    problem = json.loads(response["body"])
    assert problem.pop("requestId")  # Lambda's request id, to find the log line (m3)
    assert problem == {"type": "about:blank", "title": "Service Unavailable", "status": 503,
                       "detail": "the idempotency store is unavailable; the request did not run"}
    assert executions.count(mark) == 0


def test_http_replays_on_every_python(python_version: str, environments: Environments, shared_table: str,
                                      executions: Executions) -> None:
    env = web(environments, python_version, shared_table, {"IDEMPOTENCY_LOCAL_CACHE_SIZE": "10"})
    mark = marker()
    first = answer(env.invoke(request("v2", mark, {"marker": mark})))
    again = answer(env.invoke(request("v2", mark, {"marker": mark})))  # from the local cache
    assert again["body"] == first["body"] and headers_of(again)["idempotent-replayed"] == "true"
    assert answer(env.invoke(request("v2", mark, {"marker": mark, "changed": 1})))["statusCode"] == 422
    assert executions.count(mark) == 1


def test_a_wait_that_runs_out_is_409(primary: str, environments: Environments, shared_table: str,
                                     executions: Executions, tmp_path: Path) -> None:
    envs, mark, body, release, _answers, first = _hold_first(
        environments, primary, shared_table, {"IDEMPOTENCY_WAIT_SECONDS": "1"}, 40, executions, tmp_path, "rest")
    try:
        duplicate = answer(envs[1].invoke(request("rest", mark, body)))
        assert duplicate["statusCode"] == 409 and headers_of(duplicate)["retry-after"] == "1"
        assert "still in progress" in json.loads(duplicate["body"])["detail"]
    finally:
        release.touch()
        first.join(60)
    assert executions.count(mark) == 1


def test_identity_pool_users_sharing_a_role_session_are_two_callers(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = web(environments, primary, shared_table)
    mark = marker()
    for identity in ("us-east-1:aaaa", "us-east-1:bbbb"):
        event = request("rest", mark, {"marker": mark})
        event["requestContext"]["identity"].update({
            "cognitoIdentityId": identity, "caller": "AROAX:CognitoIdentityCredentials",
            "userArn": "arn:aws:sts::123456789012:assumed-role/Cognito_PoolAuth_Role/CognitoIdentityCredentials"})
        assert "idempotent-replayed" not in headers_of(answer(env.invoke(event)))
    assert executions.count(mark) == 2


def test_a_body_key_without_the_header_is_scoped_and_fingerprinted_too(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    env = web(environments, primary, shared_table, {"IDEMPOTENCY_KEY_JMESPATH": "json_parse(body).marker"})
    mark = marker()
    for principal in ("p-1", "p-2", "p-1"):
        answer(env.invoke(request("rest", None, {"marker": mark}, principal=principal)))
    assert executions.count(mark) == 2  # p-1's second request was a replay, p-2 never saw p-1's response
    changed = answer(env.invoke(request("rest", None, {"marker": mark, "amount": 999}, principal="p-1")))
    assert changed["statusCode"] == 422
    assert executions.count(mark) == 2


def test_record_scope_refuses_http_requests_and_unguarded_requests_are_logged(
        primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    strict = web(environments, primary, shared_table, {"IDEMPOTENCY_SCOPE": "record"})
    mark = marker()
    refused = strict.invoke(request("v2", mark, {"marker": mark}))
    assert refused.error_type == "IdempotencyKeyError" and "IDEMPOTENCY_SCOPE=record" in refused.error_message
    env = web(environments, primary, shared_table)
    before = len(env.logs())
    answer(env.invoke(request("v2", None, {"marker": mark})))
    assert "an HTTP request without the Idempotency-Key header; running it without idempotency" in env.logs()[before:]
    assert executions.count(mark) == 1


def _as_caller(form: str, event: dict[str, Any], caller: str, retry: bool) -> dict[str, Any]:
    """`event` from `caller`, told apart only by what each source's authorizer adds beyond a shared principal;
    a retry carries what changes between two sends by one caller (authorizer latency, address, renewed tokens)."""
    context = event["requestContext"]
    if form == "rest":  # a Lambda authorizer returning one principalId, the user in its context
        context["authorizer"].update(userId=caller, integrationLatency=250 if retry else 3)
        if retry:
            context["identity"].update(sourceIp="203.0.113.9", userAgent="okhttp/4.12")
    elif form == "v2":  # a JWT authorizer: one user (sub) acting for two tenants
        context["authorizer"]["jwt"]["claims"].update({
            "custom:tenant": caller, "iat": "1700003600" if retry else "1700000000",
            "exp": "1700007200" if retry else "1700003600", "jti": "jti-2" if retry else "jti-1"})
        context["authorizer"]["jwt"]["scopes"] = ["orders/write", "orders/read"][::-1 if retry else 1]
    elif form == "url":  # IAM auth: a role recreated under its name has the same ARN, another unique id
        unique = {"alice": "AROAAAAAAAAAAAAAAAAAA", "bob": "AROABBBBBBBBBBBBBBBBB"}[caller]
        context["authorizer"] = {"iam": {
            "accessKey": "ASIARENEWED" if retry else "ASIAFIRST", "accountId": http_events.ACCOUNT,
            "callerId": f"{unique}:client", "cognitoIdentity": None, "principalOrgId": None,
            "userArn": f"arn:aws:sts::{http_events.ACCOUNT}:assumed-role/orders-client/client",
            "userId": f"{unique}:client"}}
        if retry:
            context["http"]["sourceIp"] = "203.0.113.9"
    else:  # ALB authentication: the identity header ALB sets; its signed data is renewed with the session
        event["headers"].update({"x-amzn-oidc-identity": caller, "x-amzn-oidc-data": "data-2" if retry else "data-1"})
    return event


@pytest.mark.parametrize("form", ["rest", "v2", "url", "alb"])
def test_a_response_is_replayed_to_its_caller_only(form: str, primary: str, environments: Environments,
                                                   shared_table: str, executions: Executions) -> None:
    env = web(environments, primary, shared_table)
    mark = marker()
    key = f'"{mark}"'
    options = {"rest": {"principal": "api-user"}, "v2": {"sub": "user-1"}}.get(form, {})

    def send(caller: str, retry: bool = False) -> dict[str, Any]:
        return answer(env.invoke(_as_caller(form, request(form, key, {"marker": mark}, **options), caller, retry)))

    alice = send("alice")
    assert alice["statusCode"] == 201 and executions.count(mark) == 1
    bob = send("bob")  # Alice's key, Alice's body: still Bob's own request
    assert bob["statusCode"] == 201 and "idempotent-replayed" not in headers_of(bob)
    assert json.loads(bob["body"])["orderId"] != json.loads(alice["body"])["orderId"]
    assert executions.count(mark) == 2
    again = send("alice", retry=True)
    assert again["body"] == alice["body"] and headers_of(again)["idempotent-replayed"] == "true"
    assert executions.count(mark) == 2


@pytest.mark.parametrize("form", ["rest", "v2", "alb"])
def test_caller_headers_keep_callers_apart_when_the_function_authenticates_them(
        form: str, primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    """No authorizer: the function checks the Authorization header itself, so only that header tells callers
    apart (issue 20's hostile round: without IDEMPOTENCY_CALLER_HEADERS, Bob got Alice's response)."""
    env = web(environments, primary, shared_table, {"IDEMPOTENCY_CALLER_HEADERS": "Authorization"})
    mark = marker()

    def send(token: str, header: str = "Authorization") -> dict[str, Any]:
        event = request(form, f'"{mark}"', {"marker": mark})
        for name in ("headers", "multiValueHeaders"):
            if name in event:
                value = f"Bearer {token}"
                event[name][header if form == "rest" else header.lower()] = value if name == "headers" else [value]
        return answer(env.invoke(event))

    alice = send("alice")
    bob = send("bob")  # Alice's key and body, Bob's credentials: his own request
    assert "idempotent-replayed" not in headers_of(bob)
    assert json.loads(bob["body"])["orderId"] != json.loads(alice["body"])["orderId"]
    assert executions.count(mark) == 2
    again = send("alice", header="AUTHORIZATION")  # the same caller, the header in another case
    assert again["body"] == alice["body"] and headers_of(again)["idempotent-replayed"] == "true"
    assert executions.count(mark) == 2


def _with_cookie(form: str, event: dict[str, Any], cookies: list[str]) -> dict[str, Any]:
    """`cookies` where each flavour carries them: payload 2.0 (HTTP APIs, Function URLs) in the `cookies` list, the
    others in the Cookie header (`headers`, `multiValueHeaders` or both, as the source sends them)."""
    if form in ("v2", "url"):
        event["cookies"] = list(cookies)
        return event
    jar = "; ".join(cookies)
    if "headers" in event:
        event["headers"]["Cookie" if form == "rest" else "cookie"] = jar
    if "multiValueHeaders" in event:
        event["multiValueHeaders"]["Cookie" if form == "rest" else "cookie"] = [jar]
    return event


@pytest.mark.parametrize("form", FORMS)
def test_cookie_sessions_keep_callers_apart_in_every_flavour(
        form: str, primary: str, environments: Environments, shared_table: str, executions: Executions) -> None:
    """Issue 28: with IDEMPOTENCY_CALLER_HEADERS=Cookie, as the README advises for cookie sessions, Bob sending
    Alice's key and body through an HTTP API or a Function URL got Alice's response: payload 2.0 moves cookies
    out of `headers` into the event's `cookies` list, which the caller scope did not read."""
    env = web(environments, primary, shared_table, {"IDEMPOTENCY_CALLER_HEADERS": "Cookie"})
    mark = marker()

    def send(session: str) -> dict[str, Any]:
        event = request(form, f'"{mark}"', {"marker": mark})
        return answer(env.invoke(_with_cookie(form, event, [f"session={session}", "theme=dark"])))

    alice = send("alice-7f3a")
    bob = send("bob-91cc")  # Alice's key and body, Bob's session: his own request
    assert bob["statusCode"] == 201 and "idempotent-replayed" not in headers_of(bob)
    assert json.loads(bob["body"])["orderId"] != json.loads(alice["body"])["orderId"]
    assert executions.count(mark) == 2
    again = send("alice-7f3a")  # Alice's retry
    assert again["body"] == alice["body"] and headers_of(again)["idempotent-replayed"] == "true"
    assert executions.count(mark) == 2
