"""sources.http's pure parts: telling HTTP sources apart, the key header, problem responses, the replay marker."""

from __future__ import annotations

import json

import pytest

from idempotency_layer.sources import http

V2 = {"version": "2.0", "routeKey": "POST /orders", "rawPath": "/orders", "rawQueryString": "a=1",
      "headers": {"idempotency-key": '"8e03978e-40d5-43e8-bc93-6894a57f9324"', "content-type": "application/json"},
      "requestContext": {"apiId": "api", "http": {"method": "POST", "path": "/orders"},
                         "authorizer": {"jwt": {"claims": {"sub": "user-1"}, "scopes": None}}},
      "body": '{"item": 1}', "isBase64Encoded": False}
REST = {"resource": "/orders", "path": "/orders", "httpMethod": "POST",
        "headers": {"Idempotency-Key": "abc"}, "multiValueHeaders": {"Idempotency-Key": ["abc"]},
        "queryStringParameters": None, "multiValueQueryStringParameters": None,
        "requestContext": {"apiId": "api", "authorizer": {"principalId": "p-1"}, "identity": {}},
        "body": "{}"}
ALB = {"httpMethod": "POST", "path": "/orders", "headers": {"idempotency-key": "k"}, "body": "",
       "requestContext": {"elb": {"targetGroupArn": "arn"}}}


def test_each_source_is_told_apart():
    assert http.parse(V2).form == "v2" and http.parse(REST).form == "rest" and http.parse(ALB).form == "alb"
    assert http.parse({"orderId": 1}) is None and http.parse({"Records": []}) is None
    assert json.loads(http.parse(V2).caller) == {"authorizer": {"jwt": {"claims": {"sub": "user-1"}}}}
    assert json.loads(http.parse(REST).caller) == {"authorizer": {"principalId": "p-1"}}
    assert http.parse(ALB).caller is None
    assert http.parse(REST).multi and not http.parse(V2).multi


@pytest.mark.parametrize(("raw", "value"), [('"abc"', "abc"), ("abc", "abc"), ('"a\\"b"', 'a"b'),
                                            ("8e03978e-40d5", "8e03978e-40d5"), ('  "x"  ', "x")])
def test_header_values(raw, value):
    request = http.parse({**ALB, "headers": {"Idempotency-Key": raw}})
    assert http.key_header(request, "idempotency-key") == value


@pytest.mark.parametrize("raw", ['"abc', '"a\\x"', "a b", "a,b", "k1,k1", '"' + "x" * 256 + '"', '""', "caf\u00e9"])
def test_malformed_header_values(raw):
    request = http.parse({**ALB, "headers": {"idempotency-key": raw}})
    with pytest.raises(http.HeaderError):
        http.key_header(request, "Idempotency-Key")


def test_problem_responses_and_the_replay_marker_in_each_form():
    for event in (V2, REST, ALB):
        request = http.parse(event)
        response = http.problem(request, 409, "in progress", retry_after=0)
        headers = response.get("headers") or {k: v[0] for k, v in response["multiValueHeaders"].items()}
        assert response["statusCode"] == 409 and headers["Retry-After"] == "1"
        assert json.loads(response["body"])["status"] == 409
    v2 = http.parse(V2)
    assert http.mark_replayed(v2, {"ok": 1}) == {"statusCode": 200, "body": '{"ok": 1}', "isBase64Encoded": False,
                                                 "headers": {"content-type": "application/json",
                                                             "Idempotent-Replayed": "true"}}
    rest = http.mark_replayed(http.parse(REST), {"statusCode": 201, "body": ""})
    assert rest["multiValueHeaders"]["Idempotent-Replayed"] == ["true"]
    assert http.status_of(v2, "text") == 200 and http.status_of(http.parse(REST), "text") == 502


def test_every_identity_field_present_is_part_of_the_caller():
    pool = {"cognitoIdentityId": "us-east-1:a", "userArn": "arn:aws:sts::1:assumed-role/Cognito_Auth/CognitoIdentity"}
    other = {**pool, "cognitoIdentityId": "us-east-1:b"}
    a = http.parse({**REST, "requestContext": {"apiId": "api", "identity": pool}})
    b = http.parse({**REST, "requestContext": {"apiId": "api", "identity": other}})
    assert a.caller != b.caller  # identity pool users share the role session ARN
    oidc = http.parse({**ALB, "headers": {"x-amzn-oidc-identity": "alice"}})
    assert json.loads(oidc.caller) == {"oidc": "alice"}
    app = http.parse({**V2, "requestContext": {**V2["requestContext"],
                                               "authorizer": {"jwt": {"claims": {"client_id": "app1"}}}}})
    assert json.loads(app.caller) == {"authorizer": {"jwt": {"claims": {"client_id": "app1"}}}}


def test_the_replay_marker_replaces_the_handlers_own_in_any_case():
    marked = http.mark_replayed(http.parse(V2), {"statusCode": 200, "headers": {"idempotent-replayed": "false"}})
    assert marked["headers"] == {"Idempotent-Replayed": "true"}


def test_the_key_names_the_source_api_stage_method_route_and_caller():
    request = http.parse({**V2, "requestContext": {**V2["requestContext"], "stage": "prod"}})
    assert http.key_material(request, "k") == ["k", "v2", ["api", "prod"], "POST", "POST /orders", request.caller]
    assert http.key_material(http.parse(REST), "k")[2] == ["api", None]
    assert http.key_material(http.parse(ALB), "k")[2] == ["arn"]  # ALB: its target group
    # The previous material, as versions before the API and stage counted computed it (their retries' records).
    assert http.previous_key_material(request, "k") == ["k", "v2", "POST", "POST /orders", request.caller]
    assert http.previous_key_material(request, "k", ("authorization",)) == [
        "k", "v2", "POST", "POST /orders", request.caller, [None]]


def test_caller_headers_scope_the_key_in_any_case_and_leave_it_as_it_was_when_unset():
    request = http.parse({**V2, "headers": {**V2["headers"], "authorization": "Bearer alice"}})
    bob = http.parse({**V2, "headers": {**V2["headers"], "authorization": "Bearer bob"}})
    assert http.key_material(request, "k", ()) == http.key_material(request, "k")  # unset: keys as before
    assert http.key_material(request, "k", ("authorization",)) != http.key_material(bob, "k", ("authorization",))
    rest = http.parse({**REST, "headers": {**REST["headers"], "Authorization": "Bearer alice"},
                       "multiValueHeaders": {**REST["multiValueHeaders"], "Authorization": ["Bearer alice"]}})
    assert http.key_material(rest, "k", ("authorization",))[-1] == [["Bearer alice"]]
    anonymous = http.parse(V2)
    assert http.key_material(anonymous, "k", ("authorization",))[-1] == [None]  # anonymous callers share a scope


@pytest.mark.parametrize(("event", "response", "sets"), [
    (REST, {"statusCode": 200, "headers": {"SET-COOKIE": "a=1"}}, True),
    (REST, {"statusCode": 200, "multiValueHeaders": {"Set-Cookie": ["a=1", "b=2"]}}, True),
    (ALB, {"statusCode": 200, "headers": {"set-cookie": "a=1"}}, True),
    (V2, {"statusCode": 200, "cookies": ["a=1"]}, True),
    (V2, {"statusCode": 200, "cookies": []}, False),
    (REST, {"statusCode": 200, "cookies": ["a=1"]}, False),  # REST ignores a cookies list: nothing is set
    (V2, {"statusCode": 200, "headers": {"X-Set-Cookie": "a=1", "Cookie": "b=2"}}, False),
    (V2, {"headers": {"set-cookie": "a=1"}}, False),  # no statusCode: payload 2.0 sends it as the body
    (REST, "text", False),
])
def test_what_sets_a_cookie(event, response, sets):
    assert http.sets_cookie(http.parse(event), response) is sets


def test_an_anonymous_request_names_no_caller_and_carries_no_caller_header():
    alb = http.parse({**ALB, "headers": {"idempotency-key": "k", "authorization": "Bearer x"}})
    assert http.anonymous(alb, ()) and http.anonymous(alb, ("cookie",))
    assert not http.anonymous(alb, ("cookie", "authorization"))
    assert not http.anonymous(http.parse(REST), ())  # its authorizer names the caller


@pytest.mark.parametrize("value", ["", " ", "\t", ",", ", ", " , , ", "; ", ";", "=", "\u00a0"])
def test_a_caller_header_sent_blank_names_no_one(value):
    # A blank value keys a scope of its own, but every client that sends it blank shares that scope: for the cookie
    # rule and the warning it is anonymous (a hostile review found Mallory replayed Alice's cookie through it).
    blank = http.parse({**ALB, "headers": {"idempotency-key": "k", "authorization": value}})
    assert http.anonymous(blank, ("authorization",))
    named = http.parse({**ALB, "headers": {"idempotency-key": "k", "authorization": "Bearer x"}})
    assert not http.anonymous(named, ("authorization",))
    assert http.key_material(blank, "k", ("authorization",)) != http.key_material(named, "k", ("authorization",))


@pytest.mark.parametrize("cookies", [[""], ["", ""], [" ", ""]])
def test_empty_payload_2_cookies_name_no_one(cookies):
    anonymous = {**V2, "requestContext": {**V2["requestContext"], "authorizer": None}}
    assert http.anonymous(http.parse({**anonymous, "cookies": cookies}), ("cookie",))
    assert not http.anonymous(http.parse({**anonymous, "cookies": ["session=alice"]}), ("cookie",))
