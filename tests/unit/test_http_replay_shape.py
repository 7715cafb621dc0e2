"""The explicit form of a payload 2.0 simple response: its body is the text the runtime's marshaller made."""

from __future__ import annotations

from decimal import Decimal

import pytest
from awslambdaric.lambda_runtime_marshaller import LambdaMarshaller

from idempotency_layer.sources import http
from tests.support import http_events

ITEM = {"amount": Decimal("19.90"), "ratio": Decimal("1E+3"), "note": "caf\u00e9 \U0001f600", "f": 0.1}


@pytest.mark.parametrize("execution_env", ["AWS_Lambda_python3.11", "AWS_Lambda_python3.12"])
def test_the_body_is_the_runtimes_text(monkeypatch: pytest.MonkeyPatch, execution_env: str) -> None:
    monkeypatch.setenv("AWS_EXECUTION_ENV", execution_env)  # 3.12+ runtimes write non-ASCII text unescaped
    text = LambdaMarshaller().marshal_response(ITEM)[0]
    assert ("caf\u00e9" in text) == execution_env.endswith("3.12")
    request = http.parse(http_events.v2("POST", "/orders", {"Idempotency-Key": "k"}, "{}"))
    stored = http.explicit(request, ITEM, lambda _: text)
    assert stored == {"statusCode": 200, "headers": {"content-type": "application/json"}, "body": text,
                      "isBase64Encoded": False}
    replayed = http.mark_replayed(request, ITEM, lambda value: LambdaMarshaller().marshal_response(value)[0])
    assert replayed["body"] == text and replayed["headers"]["Idempotent-Replayed"] == "true"
    assert http.mark_replayed(request, stored) == {**stored, "headers": {**stored["headers"],
                                                                         "Idempotent-Replayed": "true"}}
