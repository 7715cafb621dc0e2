"""Who an HTTP request's key belongs to: every field under requestContext.authorizer, .identity (REST) and
.authentication (payload 2.0), and ALB's x-amzn-oidc-identity, but for the documented per-request fields."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from idempotency_layer.sources import http
from tests.support import http_events

# The documented list (docs/http.md): what differs between two sends of one request by one caller.
TOKEN_CLAIMS = ("iat", "exp", "nbf", "auth_time", "jti", "origin_jti", "event_id", "at_hash", "c_hash", "nonce",
                "sid", "uti", "aio", "rh")
PER_REQUEST = {("authorizer", "integrationLatency"), ("identity", "sourceIp"), ("identity", "userAgent"),
               ("identity", "accessKey"), ("authorizer", "iam", "accessKey"),
               *(("authorizer", "claims", c) for c in TOKEN_CLAIMS),
               *(("authorizer", "jwt", "claims", c) for c in TOKEN_CLAIMS)}
UNORDERED = {("authorizer", "scopes"), ("authorizer", "jwt", "scopes"), ("authorizer", "iam", "cognitoIdentity", "amr")}
PARTS = {"rest": ("authorizer", "identity"), "v2": ("authorizer", "authentication"), "url": ("authorizer",)}

# Values a field may hold (never null, "" or empty: those say "no value", as an absent field does).
scalars = st.text(min_size=1, max_size=6) | st.integers(-5, 10**6) | st.booleans()
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz:_-", min_size=1, max_size=8)
trees = st.recursive(scalars | st.lists(scalars, min_size=1, max_size=3),
                     lambda inner: st.dictionaries(names, inner, min_size=1, max_size=3), max_leaves=8)


def _with_extras(known: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Known fields, each maybe present, plus any others (API Gateway, or an authorizer, may add more)."""
    return st.tuples(st.fixed_dictionaries({}, optional=known), st.dictionaries(names, trees, max_size=2)).map(
        lambda pair: {**pair[1], **pair[0]})


text = st.text(min_size=1, max_size=6)
claims = _with_extras({c: text for c in ("sub", "iss", "aud", "client_id", "cognito:username", "email", "scope",
                                         "custom:tenant", "token_use", *TOKEN_CLAIMS)})
cert = st.fixed_dictionaries({}, optional={
    "clientCertPem": text, "subjectDN": text, "issuerDN": text, "serialNumber": text,
    "validity": st.fixed_dictionaries({}, optional={"notBefore": text, "notAfter": text})})
iam = _with_extras({**{f: text for f in ("accessKey", "accountId", "callerId", "principalOrgId", "userArn",
                                        "userId")},
                    "cognitoIdentity": st.fixed_dictionaries({}, optional={
                        "amr": st.lists(text, min_size=1, max_size=3), "identityId": text, "identityPoolId": text})})
PART_STRATEGIES = {
    ("rest", "authorizer"): _with_extras({"principalId": text, "integrationLatency": st.integers(0, 9999),
                                          "claims": claims, "scopes": st.lists(text, min_size=1, max_size=3),
                                          "userId": text, "tenant": text}),
    ("rest", "identity"): _with_extras({**{f: text for f in (
        "accessKey", "accountId", "apiKey", "apiKeyId", "caller", "cognitoAuthenticationProvider",
        "cognitoAuthenticationType", "cognitoIdentityId", "cognitoIdentityPoolId", "principalOrgId", "sourceIp",
        "user", "userAgent", "userArn", "vpceId", "vpcId")}, "clientCert": cert}),
    ("v2", "authorizer"): _with_extras({"lambda": st.dictionaries(names, trees, min_size=1, max_size=4),
                                        "jwt": st.fixed_dictionaries({"claims": claims}, optional={
                                            "scopes": st.lists(text, min_size=1, max_size=3)}),
                                        "iam": iam}),
    ("v2", "authentication"): st.fixed_dictionaries({"clientCert": cert}),
    ("url", "authorizer"): st.fixed_dictionaries({"iam": iam}),
}


def _event(form: str, parts: dict[str, Any], **request: Any) -> dict[str, Any]:
    """A request of `form` whose requestContext carries `parts`, with its own request id and time."""
    headers = {"Idempotency-Key": "k", "Content-Type": "application/json"}
    if form == "rest":
        event = http_events.rest("POST", "/orders", headers, "{}")
        event["requestContext"]["identity"] = {}
    else:
        event = http_events.v2("POST", "/orders", headers, "{}", function_url=form == "url")
    event["requestContext"].update(copy.deepcopy(parts))
    event["requestContext"].update(request)
    return event


def _excluded(path: tuple[Any, ...]) -> bool:
    return any(path[:len(p)] == p for p in PER_REQUEST)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value outside the per-request list."""
    if _excluded(path):
        return []
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, (*path, i))]
    return [path]


def _at(tree: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        tree = tree[step]
    return tree


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _parts(form: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({part: PART_STRATEGIES[form, part] for part in PARTS[form]})


FORMS = st.sampled_from(["rest", "v2", "url"])


def _shuffled(value: Any, path: tuple[str, ...], data: st.DataObject) -> Any:
    """The same fields, in another order: keys always, list items where their order means nothing."""
    if isinstance(value, dict):
        keys = data.draw(st.permutations(list(value)))
        return {k: _shuffled(value[k], (*path, k), data) for k in keys}
    if isinstance(value, list) and path in UNORDERED:
        return data.draw(st.permutations(value))
    return value


def _resend(parts: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """`parts` as a retry might carry them: per-request fields set anew, nulls for fields absent, keys reordered."""
    resent = copy.deepcopy(parts)
    for path in sorted(PER_REQUEST):
        if path[0] not in resent:
            continue
        node = resent
        for step in path[:-1]:
            node = node.setdefault(step, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):
            action = data.draw(st.sampled_from(["keep", "drop", "set"]))
            if action == "drop":
                node.pop(path[-1], None)
            elif action == "set":
                node[path[-1]] = data.draw(scalars)
    for part in resent.values():  # API Gateway sends null for identity fields that do not apply
        for name in data.draw(st.lists(st.sampled_from(["apiKey", "caller", "user", "clientCert", "lambda"]))):
            part.setdefault(name, None)
    return _shuffled(resent, (), data)


@settings(max_examples=200, deadline=None)
@given(form=FORMS, data=st.data())
def test_every_identity_field_scopes_the_key_and_per_request_fields_do_not(form: str, data: st.DataObject) -> None:
    parts = data.draw(_parts(form))
    before = http.parse(_event(form, parts)).caller
    # The same caller sending again: per-request fields, request id and time, address, key order all changed
    again = _event(form, _resend(parts, data), requestId=data.draw(text), requestTimeEpoch=data.draw(scalars))
    if form != "rest":
        again["requestContext"]["http"]["sourceIp"] = "198.51.100.7"
        again["requestContext"]["http"]["userAgent"] = data.draw(text)
    assert http.parse(again).caller == before
    # Another caller: any field outside the per-request list changed, removed or added
    leaves = _leaves(parts)
    assume(leaves)
    path = data.draw(st.sampled_from(leaves))
    old = _at(parts, path)
    changed = copy.deepcopy(parts)
    _at(changed, path[:-1])[path[-1]] = data.draw(scalars.filter(lambda v: _canonical(v) != _canonical(old)))
    assert http.parse(_event(form, changed)).caller != before
    removed = copy.deepcopy(parts)
    del _at(removed, path[:-1])[path[-1]]
    assert http.parse(_event(form, removed)).caller != before
    containers = [p[:-1] for p in leaves if isinstance(_at(parts, p[:-1]), dict)] + [(part,) for part in parts]
    container = data.draw(st.sampled_from(containers))
    added = copy.deepcopy(parts)
    name = data.draw(names.filter(lambda n: n not in _at(parts, container) and not _excluded((*container, n))))
    _at(added, container)[name] = data.draw(scalars)
    assert http.parse(_event(form, added)).caller != before


def test_the_per_request_list_is_the_documented_one() -> None:
    assert http.PER_REQUEST_FIELDS == PER_REQUEST
    section = (Path(__file__).parents[2] / "docs" / "http.md").read_text()
    for path in PER_REQUEST:
        assert f"`{path[-1]}`" in section, path


def _rest(principal: str, context: dict[str, Any]) -> dict[str, Any]:
    event = http_events.rest("POST", "/orders", {"Idempotency-Key": "k"}, "{}", principal=principal)
    event["requestContext"]["authorizer"].update(context)
    return event


def test_two_users_behind_one_principal_id_are_two_callers() -> None:
    # REST: a Lambda authorizer returning one principalId and the user in its context
    alice, bob = _rest("api-user", {"userId": "alice"}), _rest("api-user", {"userId": "bob"})
    assert http.parse(alice).caller != http.parse(bob).caller
    # Alice again: another request id, time, authorizer latency, address and client
    retry = _rest("api-user", {"userId": "alice"})
    retry["requestContext"]["authorizer"]["integrationLatency"] = 250
    retry["requestContext"]["identity"].update(sourceIp="203.0.113.9", userAgent="okhttp/4")
    assert http.parse(retry).caller == http.parse(alice).caller
    # HTTP API, JWT authorizer: one user (one sub) acting for two tenants
    tenants = []
    for tenant in ("acme", "globex"):
        event = http_events.v2("POST", "/orders", {"Idempotency-Key": "k"}, "{}", sub="user-1")
        event["requestContext"]["authorizer"]["jwt"]["claims"]["custom:tenant"] = tenant
        tenants.append(http.parse(event).caller)
    assert tenants[0] != tenants[1]
    # Function URL, IAM: a role deleted and recreated under its name is another principal (another unique id)
    roles = []
    for unique in ("AROAAAAAAAAAAAAAAAAAA", "AROABBBBBBBBBBBBBBBBB"):
        event = http_events.v2("POST", "/orders", {"Idempotency-Key": "k"}, "{}", function_url=True)
        event["requestContext"]["authorizer"] = {"iam": {
            "accessKey": "ASIAEXAMPLE", "accountId": "123456789012", "callerId": f"{unique}:session",
            "cognitoIdentity": None, "principalOrgId": None, "userId": f"{unique}:session",
            "userArn": "arn:aws:sts::123456789012:assumed-role/orders-client/session"}}
        roles.append(http.parse(event).caller)
    assert roles[0] != roles[1]
    # ALB: the OIDC identity ALB sets; its signed data header is renewed with the session and does not count
    oidc = []
    for user, data in (("alice", "jwt-1"), ("bob", "jwt-1"), ("alice", "jwt-2")):
        event = http_events.alb("POST", "/orders", {"Idempotency-Key": "k", "x-amzn-oidc-identity": user,
                                                    "x-amzn-oidc-data": data}, "{}")
        oidc.append(http.parse(event).caller)
    assert oidc[0] != oidc[1] and oidc[0] == oidc[2]


def test_the_scope_is_canonical_json_and_names_no_one_when_nothing_is_there() -> None:
    event = http_events.rest("POST", "/orders", {"Idempotency-Key": "k"}, "{}", principal="p")
    event["requestContext"]["authorizer"].update({"b": 2, "a": True})
    caller = http.parse(event).caller
    assert caller == '{"authorizer":{"a":true,"b":2,"principalId":"p"}}'
    assert re.fullmatch(r"[ -~]*", caller)  # ASCII: the same bytes however the event was decoded
    # No authorizer, identity fields all null but for the address and client: no caller, as before
    assert http.parse(http_events.rest("POST", "/orders", {"Idempotency-Key": "k"}, "{}")).caller is None
    assert http.parse(http_events.v2("POST", "/orders", {"Idempotency-Key": "k"}, "{}", function_url=True)).caller \
        is None


# -- IDEMPOTENCY_CALLER_HEADERS: every place each flavour carries a header, cookies included (issue 28) --------

HEADER_FORMS = ["rest", "v2", "url", "alb", "alb-multi"]
header_names = st.sampled_from(["Cookie", "Authorization", "X-Api-Key", "X-User-Id"])
header_values = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=";"),
                        min_size=1, max_size=12)


def _request_with(form: str, name: str, values: list[str]) -> dict[str, Any]:
    """A request of `form` carrying header `name` with `values` where that flavour carries it; a Cookie header's
    values are cookies (`name=value` pairs)."""
    headers = {"Idempotency-Key": "k"}
    if form in ("v2", "url"):
        event = http_events.v2("POST", "/orders", headers, "{}", function_url=form == "url")
        if name == "Cookie":
            event["cookies"] = list(values)  # payload 2.0 takes cookies out of the headers
        else:
            event["headers"][name.lower()] = ",".join(values)  # payload 2.0 joins repeated headers
        return event
    if form == "rest":
        event = http_events.rest("POST", "/orders", headers, "{}")
        joined = "; ".join(values) if name == "Cookie" else values[-1]
        event["headers"][name] = joined
        event["multiValueHeaders"][name] = ["; ".join(values)] if name == "Cookie" else list(values)
        return event
    event = http_events.alb("POST", "/orders", headers, "{}", multi=form == "alb-multi")
    if form == "alb-multi":
        event["multiValueHeaders"][name.lower()] = ["; ".join(values)] if name == "Cookie" else list(values)
    else:
        event["headers"][name.lower()] = "; ".join(values) if name == "Cookie" else values[-1]
    return event


def _material(event: dict[str, Any], name: str) -> str:
    return json.dumps(http.key_material(http.parse(event), ["header", "k"], (name.lower(),)))


@settings(max_examples=150, deadline=None)
@given(form=st.sampled_from(HEADER_FORMS), name=header_names,
       mine=st.lists(header_values, min_size=1, max_size=3), theirs=st.lists(header_values, min_size=1, max_size=3))
def test_a_caller_header_scopes_the_key_wherever_the_flavour_carries_it(
        form: str, name: str, mine: list[str], theirs: list[str]) -> None:
    if name == "Cookie":
        mine, theirs = [f"s{i}={v}" for i, v in enumerate(mine)], [f"s{i}={v}" for i, v in enumerate(theirs)]
    as_sent = (lambda v: "; ".join(v)) if name == "Cookie" else (lambda v: v if form in ("rest", "alb-multi")
                                                               else [",".join(v)] if form in ("v2", "url")
                                                               else [v[-1]])
    assume(as_sent(mine) != as_sent(theirs))
    alice = _material(_request_with(form, name, mine), name)
    assert _material(_request_with(form, name, mine), name) == alice  # the same caller again
    assert _material(_request_with(form, name, theirs), name) != alice  # another caller
    # Every flavour reads it: the scope differs from that of a request without the header.
    bare = _request_with(form, name, mine)
    for field in ("headers", "multiValueHeaders"):
        for header in list(bare.get(field) or {}):
            if header.lower() == name.lower():
                del bare[field][header]
    bare.pop("cookies", None)
    assert _material(bare, name) != alice


def test_a_header_only_in_headers_counts_beside_multi_value_headers() -> None:
    # A REST event whose multiValueHeaders lack a header that headers has (a hand-made or tool-made event): read.
    event = http_events.rest("POST", "/orders", {"Idempotency-Key": "k"}, "{}")
    event["headers"]["Authorization"] = "Bearer alice"
    alice = _material(event, "Authorization")
    event["headers"]["Authorization"] = "Bearer bob"
    assert _material(event, "Authorization") != alice
    event["multiValueHeaders"]["Authorization"] = ["Bearer alice"]  # both: multiValueHeaders has every value
    assert _material(event, "Authorization") == alice


def test_cookies_of_payload_2_are_the_cookie_header_and_only_there() -> None:
    event = http_events.v2("POST", "/orders", {"Idempotency-Key": "k"}, "{}")
    event["cookies"] = ["session=alice", "theme=dark"]
    assert http.parse(event).headers["cookie"] == ["session=alice; theme=dark"]
    rest = http_events.rest("POST", "/orders", {"Idempotency-Key": "k"}, "{}")
    rest["cookies"] = ["session=alice"]  # not where REST carries cookies: not read
    assert "cookie" not in http.parse(rest).headers
