"""A stand-in for IAM's policy simulator (iam:SimulatePrincipalPolicy), at the HTTP level: moto's IAM does not
implement SimulatePrincipalPolicy, and the real one cannot run here. It speaks IAM's query protocol (a form-encoded
POST, an XML answer) on a free loopback port, for boto3 pointed at it with AWS_ENDPOINT_URL_IAM.

It is an emulation, not IAM: of the conditions doctor's isolation check asks about only. Each statement given to
`grant` allows its actions on any resource, either with no condition (`leading_keys=None`) or under
`ForAllValues:StringLike` on `dynamodb:LeadingKeys` (each value must match one of the patterns, `*` and `?` as IAM
reads them), and with `null_guard=True` also `Null` `{dynamodb:LeadingKeys: false}`. A request with no
dynamodb:LeadingKeys context entry is evaluated as IAM evaluates a missing key: ForAllValues over no values is
true, so only the Null guard denies it. A role with no statement gets `implicitDeny`. `deny_callers()` makes every
call answer 403 AccessDenied, as IAM answers credentials without iam:SimulatePrincipalPolicy. Every request is
kept in `seen`."""

from __future__ import annotations

import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

_NS = "https://iam.amazonaws.com/doc/2010-05-08/"


def _like(pattern: str, value: str) -> bool:
    """IAM's StringLike: `*` any run of characters, `?` one character, nothing else special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.DOTALL) is not None


def members(form: dict[str, str], name: str) -> list[str]:
    """The values of a query-protocol list `name.member.N`, in order."""
    found = sorted((int(key[len(name) + 8:]), value) for key, value in form.items()
                   if key.startswith(f"{name}.member.") and key[len(name) + 8:].isdigit())
    return [value for _, value in found]


def context_values(form: dict[str, str], key_name: str) -> list[str] | None:
    """The ContextKeyValues of the ContextEntries member named `key_name`, or None when there is none."""
    for index in range(1, 50):
        base = f"ContextEntries.member.{index}"
        if base + ".ContextKeyName" not in form:
            return None
        if form[base + ".ContextKeyName"] == key_name:
            return members(form, base + ".ContextKeyValues")
    return None


class IAMSimulator(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.statements: dict[str, list[tuple[frozenset[str], tuple[str, ...] | None, bool]]] = {}
        self.denied = False
        self.seen: list[dict[str, str]] = []
        super().__init__(("127.0.0.1", 0), _Handler)
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def grant(self, role: str, actions: list[str], leading_keys: list[str] | None, null_guard: bool = False) -> None:
        self.statements.setdefault(role, []).append((frozenset(actions), None if leading_keys is None
                                                     else tuple(leading_keys), null_guard))

    def deny_callers(self, denied: bool = True) -> None:
        self.denied = denied

    def decide(self, role: str, action: str, keys: list[str] | None) -> str:
        for actions, patterns, null_guard in self.statements.get(role, []):
            if action not in actions:
                continue
            if null_guard and keys is None:  # Null {dynamodb:LeadingKeys: false}: the key must be present
                continue
            # ForAllValues over a missing key is over no values: true
            if patterns is None or all(any(_like(p, key) for p in patterns) for key in keys or []):
                return "allowed"
        return "implicitDeny"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, code: str, message: str) -> None:
        self._answer(status, f'<ErrorResponse xmlns="{_NS}"><Error><Type>Sender</Type><Code>{code}</Code>'
                     f"<Message>{escape(message)}</Message></Error><RequestId>{uuid.uuid4()}</RequestId>"
                     "</ErrorResponse>")

    def do_POST(self) -> None:
        server: IAMSimulator = self.server  # type: ignore[assignment]
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        form = {key: values[0] for key, values in parse_qs(body, keep_blank_values=True).items()}
        server.seen.append(form)
        if form.get("Action") != "SimulatePrincipalPolicy":
            self._error(400, "InvalidAction", f"{form.get('Action')} is not emulated here")
            return
        role = form.get("PolicySourceArn", "")
        if server.denied:
            self._error(403, "AccessDenied", f"User: arn:aws:iam::123456789012:user/operator is not authorized to "
                        f"perform: iam:SimulatePrincipalPolicy on resource: {role}")
            return
        keys = context_values(form, "dynamodb:LeadingKeys")
        results = "".join(
            f"<member><EvalActionName>{escape(action)}</EvalActionName><EvalResourceName>{escape(resource)}"
            f"</EvalResourceName><EvalDecision>{server.decide(role, action, keys)}</EvalDecision>"
            "<MatchedStatements/><MissingContextValues/></member>"
            for action in members(form, "ActionNames") for resource in members(form, "ResourceArns") or ["*"])
        self._answer(200, f'<SimulatePrincipalPolicyResponse xmlns="{_NS}"><SimulatePrincipalPolicyResult>'
                     f"<IsTruncated>false</IsTruncated><EvaluationResults>{results}</EvaluationResults>"
                     "</SimulatePrincipalPolicyResult><ResponseMetadata><RequestId>"
                     f"{uuid.uuid4()}</RequestId></ResponseMetadata></SimulatePrincipalPolicyResponse>")
