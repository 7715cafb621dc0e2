"""HTTP requests: API Gateway REST (payload 1.0), HTTP API and Function URLs (payload 2.0), and ALB.

Turns an HTTP event into what the cycle needs (a key from the Idempotency-Key header, scoped to the method,
the route and every identity of the caller the request carries; a default payload fingerprint) and shapes
responses the way each source expects them: problem responses (RFC 9457) for the layer's errors, and the replay
marker header. `plan` makes a request's plan; `answer` says the layer's errors as problem responses; the executor
carries the plan out. Nothing here touches the table.
"""

from __future__ import annotations

import json
import logging
from collections import namedtuple
from collections.abc import Callable

from .. import errors
from ..keys import KeyDeriver, digest, is_empty
from ..log import fields
from ..plan import HTTP, REQUIRED, Note, Plan, Unit

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any, NamedTuple

logger = logging.getLogger("idempotency_layer")

MAX_KEY_LENGTH = 255
REPLAYED = "Idempotent-Replayed"
_TITLES = {400: "Bad Request", 409: "Conflict", 422: "Unprocessable Content", 500: "Internal Server Error",
           503: "Service Unavailable"}


_FORMS = {"rest": "REST API (payload 1.0)", "v2": "HTTP API or Function URL (payload 2.0)", "alb": "ALB"}


class HeaderError(ValueError):
    """The idempotency key header is malformed: the request gets a 400."""


if TYPE_CHECKING:
    class _RequestFields(NamedTuple):
        form: str  # "rest" (API Gateway payload 1.0), "v2" (HTTP API payload 2.0, Function URLs) or "alb"
        method: str
        route: str  # the route template when the source names one (resource, routeKey), else the path
        path: str
        query: Any  # the query as the source gives it (a string or a map), part of the default fingerprint
        body: Any
        headers: dict[str, list[str]]  # lower-cased names, every value
        multi: bool  # the request came with multiValueHeaders: the response must use them too (ALB requires it)
        caller: str | None  # who is calling (canonical JSON), when an authorizer, IAM, mTLS or ALB named anyone
        origin: list[str | None]  # what it came through: the API and its stage (REST, payload 2.0); ALB's target group
else:
    _RequestFields = namedtuple("Request", (
        "form",
        "method",
        "route",
        "path",
        "query",
        "body",
        "headers",
        "multi",
        "caller",
        "origin",
    ))


class Request(_RequestFields):

    __slots__ = ()


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _headers(event: dict[str, Any], form: str) -> tuple[dict[str, list[str]], bool]:
    """Every request header, wherever the source put it: `multiValueHeaders` (every value), `headers` for a name
    not there (REST sends both, ALB one or the other), and payload 2.0's `cookies` list as the one `Cookie`
    header it was (HTTP APIs and Function URLs take cookies out of `headers`)."""
    found: dict[str, list[str]] = {}
    multi = isinstance(event.get("multiValueHeaders"), dict)
    if multi:
        for name, values in event["multiValueHeaders"].items():
            if isinstance(name, str) and isinstance(values, list):
                found.setdefault(name.lower(), []).extend(v for v in values if isinstance(v, str))
    if isinstance(event.get("headers"), dict):
        single: dict[str, list[str]] = {}
        for name, value in event["headers"].items():
            if isinstance(name, str) and isinstance(value, str):
                single.setdefault(name.lower(), []).append(value)
        for name, values in single.items():
            if name not in found:
                found[name] = values
    cookies = event.get("cookies") if form == "v2" else None
    if isinstance(cookies, list):
        jar = "; ".join(cookie for cookie in cookies if isinstance(cookie, str))
        if jar:
            found.setdefault("cookie", []).append(jar)
    return found, multi


# Every field API Gateway puts under these parts of requestContext says who is calling (an authorizer's output,
# the IAM or Cognito identity, the API key, the mTLS certificate), so all of them scope the key: a Lambda
# authorizer may return one principalId for every user and name the user in its context alone.
_CALLER_PARTS = {"rest": ("authorizer", "identity"), "v2": ("authorizer", "authentication")}

# Fields under those parts (paths from requestContext) that differ between two sends of one request by one caller,
# so that a retry would not be replayed if they counted. Nothing else under those parts is left out. Request ids
# and times are elsewhere in requestContext and never count.
_TOKEN_CLAIMS = ("iat", "exp", "nbf", "auth_time", "jti", "origin_jti", "event_id", "at_hash", "c_hash", "nonce",
                 "sid", "uti", "aio", "rh")
PER_REQUEST_FIELDS: frozenset[tuple[str, ...]] = frozenset({
    ("authorizer", "integrationLatency"),  # REST Lambda authorizers: how long this request's authorizer took
    ("identity", "sourceIp"),  # the client's network address: a mobile client's changes between retries
    ("identity", "userAgent"),  # the client's software, which a retry (another library, a proxy) may change
    ("identity", "accessKey"),  # the access key id of temporary credentials, renewed every hour or so:
    ("authorizer", "iam", "accessKey"),  # the principal is userArn/caller/userId, which stay
    # JWT claims that name the token rather than the user: they change when the client refreshes its token
    *(("authorizer", "claims", claim) for claim in _TOKEN_CLAIMS),  # REST Cognito user pool authorizer
    *(("authorizer", "jwt", "claims", claim) for claim in _TOKEN_CLAIMS),  # HTTP API JWT authorizer
})
# Lists whose order carries no meaning: sorted, so a token that lists them in another order is the same caller.
_UNORDERED = frozenset({("authorizer", "scopes"), ("authorizer", "jwt", "scopes"),
                        ("authorizer", "iam", "cognitoIdentity", "amr")})


def _selected(value: Any, path: tuple[str, ...]) -> Any:
    """`value` without the per-request fields and without empty values (null, "", [], {}): the same caller
    whether a field is null or absent, as API Gateway sends either."""
    if isinstance(value, dict):
        kept = {}
        for name, item in value.items():
            inner = (*path, str(name))
            if inner not in PER_REQUEST_FIELDS:
                item = _selected(item, inner)
                if item is not None:
                    kept[str(name)] = item
        return kept or None
    if isinstance(value, list):
        items = [_selected(item, path) for item in value]
        if path in _UNORDERED:
            items.sort(key=_canonical)
        return items or None
    return None if value is None or value == "" else value


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _caller(event: dict[str, Any], form: str, headers: dict[str, list[str]]) -> str | None:
    """Canonical JSON of everything that says who is calling, or None when the request names no one."""
    if form == "alb":  # ALB authentication (OIDC, Cognito) passes the user's identity in a header ALB sets itself;
        # x-amzn-oidc-data (a signed JWT) and the access token change whenever ALB refreshes the session
        identity = headers.get("x-amzn-oidc-identity")
        return _canonical({"oidc": identity[0]}) if identity else None
    context = event["requestContext"]  # (parse checked it is an object)
    found = {part: _selected(context.get(part), (part,)) for part in _CALLER_PARTS[form]}
    found = {part: value for part, value in found.items() if value is not None}
    return _canonical(found) if found else None


def _origin(context: dict[str, Any], form: str) -> list[str | None]:
    """The API and stage (REST, payload 2.0: a Function URL's is its url-id and `$default`), or ALB's target group,
    the request came through: a test stage or a second API invoking the same function is another scope."""
    if form == "alb":
        return [_text(context["elb"].get("targetGroupArn"))]
    return [_text(context.get("apiId")), _text(context.get("stage"))]


def parse(event: Any) -> Request | None:
    """The HTTP request `event` is, or None when it has no HTTP source's shape."""
    if not isinstance(event, dict) or not isinstance(event.get("requestContext"), dict):
        return None
    context = event["requestContext"]
    if event.get("version") == "2.0" and isinstance(context.get("http"), dict):
        form = "v2"
        method = _text(context["http"].get("method")) or ""
        path = _text(event.get("rawPath")) or _text(context["http"].get("path")) or ""
        route_key = _text(event.get("routeKey"))
        route = route_key if route_key and route_key != "$default" else path
        query = event.get("rawQueryString") or ""
    elif isinstance(context.get("elb"), dict):
        form = "alb"
        method = _text(event.get("httpMethod")) or ""
        path = _text(event.get("path")) or ""
        route = path
        query = event.get("multiValueQueryStringParameters") or event.get("queryStringParameters") or {}
    elif isinstance(event.get("httpMethod"), str) and _text(context.get("apiId")):
        form = "rest"
        method = event["httpMethod"]
        path = _text(event.get("path")) or ""
        route = _text(event.get("resource")) or path
        query = event.get("multiValueQueryStringParameters") or event.get("queryStringParameters") or {}
    else:
        return None
    headers, multi = _headers(event, form)
    return Request(form, method.upper(), route, path, query, event.get("body"), headers, multi,
                   _caller(event, form, headers), _origin(context, form))


def _bare(value: str) -> bool:
    return all(0x21 <= ord(c) <= 0x7E and c not in '"\\,;' for c in value)


def key_header(request: Request, name: str) -> str | None:
    """The idempotency key the request carries in header `name`, or None when it has none.

    The value is a Structured Field string (a quoted string, escapes for quote and backslash only), or a bare
    run of visible ASCII; at most 255 characters. Raises `HeaderError` for anything else, or for the header
    sent more than once."""
    values = request.headers.get(name.lower())
    if not values:
        return None
    if len(values) > 1:
        raise HeaderError(f"the {name} header was sent {len(values)} times; send it once")
    raw = values[0].strip(" \t")
    if raw.startswith('"'):
        if len(raw) < 2 or not raw.endswith('"'):
            raise HeaderError(f"the {name} header is not a valid string: an opening quote without a closing one")
        chars: list[str] = []
        inner = raw[1:-1]
        i = 0
        while i < len(inner):
            c = inner[i]
            if c == "\\":
                if i + 1 >= len(inner) or inner[i + 1] not in '"\\':
                    raise HeaderError(f"the {name} header is not a valid string: only \\\" and \\\\ may be escaped")
                chars.append(inner[i + 1])
                i += 2
                continue
            if c == '"' or not 0x20 <= ord(c) <= 0x7E:
                raise HeaderError(f"the {name} header is not a valid string: it holds a character a string may not")
            chars.append(c)
            i += 1
        value = "".join(chars)
    elif "," in raw:
        raise HeaderError(f"the {name} header was sent more than once (its values joined with commas); send it once")
    elif _bare(raw):
        value = raw
    else:
        raise HeaderError(f"the {name} header is neither a quoted string nor a bare token of visible ASCII")
    if not value:
        raise HeaderError(f"the {name} header is empty")
    if len(value) > MAX_KEY_LENGTH:
        raise HeaderError(f"the {name} header is {len(value)} characters; at most {MAX_KEY_LENGTH} are accepted")
    return value


def key_material(request: Request, value: Any, caller_headers: tuple[str, ...] = ()) -> list[Any]:
    """What the stored key is made of: one caller's key for one route of one API stage (or ALB target group) of
    one source, never another caller's. `caller_headers` (IDEMPOTENCY_CALLER_HEADERS, lower-cased) name the caller
    too: every value of each, or null for one the request does not carry."""
    material = previous_key_material(request, value, caller_headers)
    material.insert(2, request.origin)  # (a list where the previous material has the method: the two never meet)
    return material


def previous_key_material(request: Request, value: Any, caller_headers: tuple[str, ...] = ()) -> list[Any]:
    """What the stored key was made of before the API, stage and target group were part of it: the request's key
    then, consulted by a first run for one TTL after the upgrade (IDEMPOTENCY_HTTP_PREVIOUS_KEYS). Unset,
    `caller_headers` leave the key what it was before that setting existed."""
    material = [value, request.form, request.method, request.route, request.caller]
    if caller_headers:
        material.append([request.headers.get(name) for name in caller_headers])
    return material


def default_payload(request: Request) -> list[Any]:
    """What a reused header key must match when IDEMPOTENCY_PAYLOAD_JMESPATH is unset."""
    return [request.method, request.path, request.query, request.body]


def _response(request: Request, status: int, headers: dict[str, str], body: str) -> dict[str, Any]:
    response: dict[str, Any] = {"statusCode": status, "body": body, "isBase64Encoded": False}
    if request.multi:
        response["multiValueHeaders"] = {name: [value] for name, value in headers.items()}
    else:
        response["headers"] = dict(headers)
    if request.form == "alb":
        response["statusDescription"] = f"{status} {_TITLES.get(status, '')}".strip()
    return response


def problem(request: Request, status: int, detail: str, retry_after: int | None = None,
            request_id: str | None = None) -> dict[str, Any]:
    """An application/problem+json response (RFC 9457) in the source's format: `detail` is a generic sentence
    (no event content, no key, prefix or setting), and `request_id` (Lambda's aws_request_id) an extension member,
    to find the log line that says the rest."""
    problem: dict[str, Any] = {"type": "about:blank", "title": _TITLES.get(status, "Error"), "status": status,
                               "detail": detail}
    if request_id:
        problem["requestId"] = request_id
    headers = {"Content-Type": "application/problem+json"}
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, retry_after))
    return _response(request, status, headers, json.dumps(problem, separators=(",", ":")))


def status_of(request: Request, response: Any) -> int:
    """The status the client sees for `response`: payload 2.0 infers 200 for a value without a statusCode;
    REST and ALB answer 502 to anything that is not a response object."""
    code = response.get("statusCode") if isinstance(response, dict) else None
    if isinstance(code, bool):
        code = None
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if isinstance(code, int):
        return code
    return 200 if request.form == "v2" and (not isinstance(response, dict) or "statusCode" not in response) else 502


def storable(request: Request, response: Any, key: str) -> bool:
    """Whether the handler's `response` to `request` is stored: not when the client saw a server error (a 5xx, or a
    value the gateway cannot answer, which it answers 502), so a retry runs again. The second is said."""
    status = status_of(request, response)
    if status == 502 and not (isinstance(response, dict) and response.get("statusCode") in (502, "502")):
        logger.warning("the handler's answer is not a response object the gateway can answer (%s): not stored, so "
                       "a retry runs the handler again", _unanswerable(response), extra=fields(key))
    return status < 500


def anonymous(request: Request, caller_headers: tuple[str, ...]) -> bool:
    """Whether nothing scopes the request's key to its caller: no authorizer, IAM, mTLS or ALB identity names one,
    and it carries none of `caller_headers` (IDEMPOTENCY_CALLER_HEADERS, lower-cased) with a value that names
    someone (a letter or digit in it). Every such caller shares one scope per key. (A blank header, or one of
    separators alone (`,` when a header is sent twice empty, `; ` of empty cookies), keys a scope of its own, but
    it names no one: every client that sends it so shares that scope, so a cookie set for it is not stored.)"""
    return request.caller is None and not any(
        _names_someone(value) for name in caller_headers for value in request.headers.get(name, ()))


def _names_someone(value: str) -> bool:
    return any(character.isalnum() for character in value)


def sets_cookie(request: Request, response: Any) -> bool:
    """Whether `response` sets a cookie: a `Set-Cookie` header in any case, in `headers` or `multiValueHeaders`,
    or payload 2.0's `cookies` list. A value that is not a response object sets none (payload 2.0 sends it as
    the body; REST and ALB answer it 502)."""
    if not isinstance(response, dict) or "statusCode" not in response:
        return False
    for part in ("headers", "multiValueHeaders"):
        found = response.get(part)
        if isinstance(found, dict) and any(isinstance(name, str) and name.lower() == "set-cookie" for name in found):
            return True
    return request.form == "v2" and bool(response.get("cookies"))


def _unanswerable(response: Any) -> str:
    if not isinstance(response, dict):
        return f"a {type(response).__name__}, not an object"
    if "statusCode" not in response:
        return "no statusCode"
    return f"a {type(response['statusCode']).__name__} statusCode, not an integer"


def explicit(request: Request, response: Any, dumps: Callable[[Any], str | bytes] = json.dumps) -> Any:
    """A payload 2.0 value that is not a response object, in the explicit form API Gateway makes of it: a 200
    whose body is the JSON text the function sent, which `dumps` gives (the runtime's marshaller: Decimal,
    non-ASCII and floats as it writes them)."""
    if request.form != "v2" or (isinstance(response, dict) and "statusCode" in response):
        return response
    if isinstance(response, str):
        body = response
    else:
        text = dumps(response)
        body = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    return {"statusCode": 200, "headers": {"content-type": "application/json"}, "body": body,
            "isBase64Encoded": False}


def mark_replayed(request: Request, response: Any, dumps: Callable[[Any], str | bytes] = json.dumps) -> Any:
    """`response` with `Idempotent-Replayed: true`, where the source reads headers from (`dumps`: see `explicit`)."""
    response = explicit(request, response, dumps)
    if not isinstance(response, dict):
        return response  # not a response object: the gateway answers 502 for it, with or without a header
    marked = dict(response)
    lowered = REPLAYED.lower()
    if request.multi or isinstance(marked.get("multiValueHeaders"), dict):
        values = {k: v for k, v in (marked.get("multiValueHeaders") or {}).items() if str(k).lower() != lowered}
        values[REPLAYED] = ["true"]
        marked["multiValueHeaders"] = values
    if not request.multi or isinstance(marked.get("headers"), dict):
        headers = {k: v for k, v in (marked.get("headers") or {}).items() if str(k).lower() != lowered}
        headers[REPLAYED] = "true"
        marked["headers"] = headers
    return marked


def request_key(keys: KeyDeriver, settings: Any, request: Request, event: Any) -> tuple[str | None, str | None]:
    """The key and fingerprint of `request`, or (None, None) when it has no key; raises HeaderError or
    IdempotencyKeyError. `settings`: the configuration (or a runner), for key_header, key_jmespath,
    payload_jmespath and caller_headers. Side-effect free: the operator CLI derives keys with it too."""
    key, fingerprint, _ = request_keys(keys, settings, request, event)
    return key, fingerprint


def request_keys(keys: KeyDeriver, settings: Any, request: Request, event: Any
                 ) -> tuple[str | None, str | None, str | None]:
    """`request_key`'s key and fingerprint, and the request's previous key (`previous_key_material`) when
    IDEMPOTENCY_HTTP_PREVIOUS_KEYS consults it, else None."""
    header = key_header(request, settings.key_header)
    # The header's value, else what the key expression selects; tagged, so the two never meet.
    value: list[Any] | None = None if header is None else ["header", header]
    if value is None and settings.key_jmespath:
        selected = keys.select(event)
        value = None if is_empty(selected) else ["expression", selected]
    if value is None:
        return None, None, None  # the whole-event key would make every retry new: requests carry ids
    key = keys.key_of(key_material(request, value, settings.caller_headers))
    previous = (keys.key_of(previous_key_material(request, value, settings.caller_headers))
                if settings.http_previous_keys else None)
    previous = None if previous == key else previous  # (never, as the two materials differ: but never our own)
    if settings.payload_jmespath:
        return key, _bound_to_path(request, keys.fingerprint(event)), previous
    return key, f"{digest(default_payload(request))}.http", previous


def _bound_to_path(request: Request, fingerprint: str | None) -> str | None:
    """The payload expression's fingerprint, bound to the request's path when its route is a template
    (`/{proxy+}`, `/orders/{id}`): the key covers every path under such a route, and a key reused on another path
    is another request whatever the expression selects. Its own tag, so records fingerprinted without the path
    are compared with nothing, as records of another expression are."""
    if fingerprint is None or "{" not in request.route:
        return fingerprint
    selected, _, tag = fingerprint.partition(".")
    return f"{digest([request.path, selected])}.{tag}+path"


def plan(settings: Any, keys: KeyDeriver, request: Request, event: Any) -> Plan:
    """The request's one unit: its scoped key and fingerprint (the header's, else the key expression's); or the
    400 it is answered (`refusal`: a malformed header, an expression that cannot be applied, no key under
    IDEMPOTENCY_REQUIRE_KEY); or no key, and it runs unguarded. Notes: the pass-through's warning, and each caller
    header a keyed request of its format comes without (once per environment and format)."""
    try:
        key, fingerprint, previous = request_keys(keys, settings, request, event)
    except (HeaderError, errors.IdempotencyKeyError) as error:
        return Plan(HTTP, (Unit(None),), request=request, refusal=error)
    if key is None:
        if settings.require_key:
            refusal = errors.IdempotencyKeyError(
                f"the request has no {settings.key_header} header and IDEMPOTENCY_REQUIRE_KEY is true")
            return Plan(HTTP, (Unit(None, refused=REQUIRED),), request=request, refusal=refusal)
        expression = (f" and nothing selected by IDEMPOTENCY_KEY_JMESPATH={settings.key_jmespath!r}"
                      if settings.key_jmespath else "")
        note = Note(logging.WARNING, f"an HTTP request without the {settings.key_header} header{expression}; running "
                                     "it without idempotency", None, "passed_through")
        return Plan(HTTP, (Unit(None),), request=request, notes=(note,))
    notes = tuple(
        Note(logging.WARNING, f"IDEMPOTENCY_CALLER_HEADERS names {name!r}, which a request came without "
                              f"({_FORMS[request.form]}): requests without it share one scope per key (said once per "
                              "environment and format); if your callers always send it, it does not reach the "
                              "function in this format", key, once=f"caller header {request.form} {name}")
        for name in settings.caller_headers if name not in request.headers)
    carried = [name for name in ("Authorization", "Cookie") if name.lower() in request.headers]
    if carried and anonymous(request, settings.caller_headers):
        notes += (Note(logging.WARNING, f"an HTTP request carries {' and '.join(carried)} but its key is scoped to no "
                                        "caller (no authorizer names one, and IDEMPOTENCY_CALLER_HEADERS does not "
                                        "name the header): every caller sending the same key shares its response; if "
                                        "the function authenticates callers by it, name it in "
                                        "IDEMPOTENCY_CALLER_HEADERS (said once per environment, counted as "
                                        "AnonymousScope)", key, once="anonymous scope",
                            metric="AnonymousScope"),)
    return Plan(HTTP, (Unit(key, fingerprint, previous=previous),), request=request, notes=notes)


# What an HTTP caller is told of the layer's errors: generic, so that no key, key prefix, expression or setting
# reaches a caller who may be anyone (the log line, found by the request id, says the rest).
_DETAILS = {
    "mismatch": "this idempotency key was used before with another request (its method, path, query or body "
                "differ); the request did not run",
    "payload": "this idempotency key was used before with another request (its payload or path differ); the "
               "request did not run",
    "in_progress": "a request with this idempotency key is still in progress; retry it later",
    "replay": "a request with this idempotency key ran before, but its response cannot be replayed (too large to "
              "store, or not one the runtime could send); the request did not run again",
    "key": "the idempotency key of this request cannot be used (see the function's log for its request id); the "
           "request did not run",
    "store": "the idempotency store is unavailable; the request did not run",
}


def refuse(request: Request, error: Exception, required: bool, key_header: str,
           request_id: str | None = None) -> dict[str, Any]:
    """The 400 for a request refused before anything ran (its plan's `refusal`), said in the log: a malformed key
    header is described (it is the caller's own input); no key under IDEMPOTENCY_REQUIRE_KEY, or a key or payload
    expression that cannot be applied, is said generically."""
    if isinstance(error, HeaderError):
        logger.info("%s; answered 400", error, extra=fields(None, "not_claimed"))
        return problem(request, 400, str(error), request_id=request_id)
    if required:
        logger.info("%s; answered 400", error, extra=fields(None, "not_claimed"))
        return problem(request, 400, f"the request has no {key_header} header, which this endpoint requires; it "
                                     "did not run", request_id=request_id)
    logger.warning("%s; answered 400", error, extra=fields(None, "not_claimed"))
    return problem(request, 400, _DETAILS["key"], request_id=request_id)


def answer(request: Request, error: errors.IdempotencyError, key: str, payload_jmespath: str | None,
           request_id: str | None = None) -> Any:
    """The problem response for the layer's `error` about `key` (the handler did not run), said in the log with
    the error's own words; an error with no HTTP answer is raised again."""
    if isinstance(error, errors.IdempotencyPayloadMismatchError):
        logger.info("%s; answered 422", error, extra=fields(key, "mismatch"))
        return problem(request, 422, _DETAILS["payload" if payload_jmespath else "mismatch"], request_id=request_id)
    if isinstance(error, errors.IdempotencyAlreadyInProgressError):
        logger.info("%s; answered 409", error, extra=fields(key, "in_progress"))
        return problem(request, 409, _DETAILS["in_progress"], retry_after=1, request_id=request_id)
    if isinstance(error, (errors.IdempotencyResultTooLargeError, errors.IdempotencyResultUndeliverableError)):
        logger.warning("%s; answered 500", error, extra=fields(key, "replay"))
        return problem(request, 500, _DETAILS["replay"], request_id=request_id)
    if isinstance(error, errors.IdempotencyKeyError):
        logger.warning("%s; answered 400", error, extra=fields(key))
        return problem(request, 400, _DETAILS["key"], request_id=request_id)
    if isinstance(error, (errors.IdempotencyPersistenceLayerError, errors.IdempotencyClaimConflictError)):
        if not getattr(error, "integrity", False):  # a record refused as not authentic was said where it was read
            logger.error("%s; answered 503", error, extra=fields(key, "store_error"))
        return problem(request, 503, _DETAILS["store"], retry_after=1, request_id=request_id)
    raise error
