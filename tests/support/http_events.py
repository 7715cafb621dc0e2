"""HTTP events shaped as API Gateway (REST payload 1.0, HTTP API payload 2.0), Function URLs and ALB send
them, after AWS's published sample events; every request gets its own request id and time."""

from __future__ import annotations

import time
import uuid
from typing import Any

ACCOUNT = "123456789012"


def _now() -> tuple[str, int]:
    epoch = int(time.time() * 1000)
    return time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(epoch / 1000)), epoch


def rest(method: str, path: str, headers: dict[str, str], body: str | None, resource: str | None = None,
         principal: str | None = None, claims: dict[str, str] | None = None) -> dict[str, Any]:
    when, epoch = _now()
    authorizer: dict[str, Any] | None = None
    if principal:
        authorizer = {"principalId": principal, "integrationLatency": 3}
    elif claims:
        authorizer = {"claims": claims}
    return {
        "resource": resource or path, "path": path, "httpMethod": method,
        "headers": dict(headers), "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": None, "multiValueQueryStringParameters": None,
        "pathParameters": None, "stageVariables": None,
        "requestContext": {
            "accountId": ACCOUNT, "apiId": "1234567890", "authorizer": authorizer,
            "domainName": "id.execute-api.us-east-1.amazonaws.com",
            "extendedRequestId": uuid.uuid4().hex[:16], "httpMethod": method,
            "identity": {"accessKey": None, "accountId": None, "caller": None, "cognitoIdentityId": None,
                         "sourceIp": "192.0.2.1", "user": None, "userAgent": "curl/8", "userArn": None},
            "path": f"/prod{path}", "protocol": "HTTP/1.1", "requestId": str(uuid.uuid4()),
            "requestTime": when, "requestTimeEpoch": epoch, "resourceId": "abc123", "resourcePath": resource or path,
            "stage": "prod",
        },
        "body": body, "isBase64Encoded": False,
    }


def v2(method: str, path: str, headers: dict[str, str], body: str | None, route: str | None = None,
       sub: str | None = None, function_url: bool = False) -> dict[str, Any]:
    when, epoch = _now()
    context: dict[str, Any] = {
        "accountId": ACCOUNT if not function_url else "anonymous", "apiId": "api-id", "domainName": "id.example.com",
        "domainPrefix": "id", "http": {"method": method, "path": path, "protocol": "HTTP/1.1",
                                       "sourceIp": "192.0.2.1", "userAgent": "curl/8"},
        "requestId": str(uuid.uuid4()), "routeKey": "$default" if function_url else (route or f"{method} {path}"),
        "stage": "$default", "time": when, "timeEpoch": epoch,
    }
    if sub:
        context["authorizer"] = {"jwt": {"claims": {"sub": sub}, "scopes": None}}
    return {
        "version": "2.0", "routeKey": context["routeKey"], "rawPath": path, "rawQueryString": "",
        "headers": {k.lower(): v for k, v in headers.items()}, "requestContext": context,
        "body": body, "isBase64Encoded": False,
    }


def alb(method: str, path: str, headers: dict[str, str], body: str | None, multi: bool = False) -> dict[str, Any]:
    event: dict[str, Any] = {
        "requestContext": {"elb": {"targetGroupArn": f"arn:aws:elasticloadbalancing:us-east-1:{ACCOUNT}:"
                                                     "targetgroup/lambda-target/1234567890abcdef"}},
        "httpMethod": method, "path": path, "body": body or "", "isBase64Encoded": False,
    }
    trace = {"x-amzn-trace-id": f"Root=1-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:24]}"}
    if multi:
        event["multiValueQueryStringParameters"] = {}
        event["multiValueHeaders"] = {k.lower(): [v] for k, v in {**headers, **trace}.items()}
    else:
        event["queryStringParameters"] = {}
        event["headers"] = {k.lower(): v for k, v in {**headers, **trace}.items()}
    return event
