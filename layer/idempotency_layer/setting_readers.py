"""How one setting is read from the environment: trimmed UTF-8 text, a boolean, a number within bounds, one of
named choices. Each raises `IdempotencyConfigurationError` naming the variable, the value and what is accepted.
config.py and store_settings.py read every setting through these."""

from __future__ import annotations

import re
from collections.abc import Mapping

from .errors import IdempotencyConfigurationError

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_WHOLE = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?|-?\.[0-9]+")


def text(env: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 reach Python as lone surrogates
        raise IdempotencyConfigurationError(f"{name} is not valid UTF-8 text") from None
    return value.strip()


def boolean(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = text(env, name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise IdempotencyConfigurationError(
        f"{name}={value!r} is not a boolean; accepted: true/false, 1/0, yes/no (any case)"
    )


def number(env: Mapping[str, str], name: str, default: float, minimum: float, maximum: float, kind: type) -> Any:
    value = text(env, name)
    if value is None:
        return default
    # Plain ASCII decimals only: Python's int() and float() also take "1_0", other scripts' digits, "inf".
    pattern = _WHOLE if kind is int else _DECIMAL
    parsed = kind(value) if pattern.fullmatch(value) else None
    if parsed is None or not minimum <= parsed <= maximum:
        what = "a whole number" if kind is int else "seconds"
        raise IdempotencyConfigurationError(
            f"{name}={value!r} is not accepted; expected {what} from {minimum} to {maximum}"
        )
    return parsed


def choice(env: Mapping[str, str], name: str, default: str, accepted: tuple[str, ...]) -> str:
    value = text(env, name, default)
    assert value is not None
    for option in accepted:
        if value.lower() == option.lower():
            return option
    raise IdempotencyConfigurationError(f"{name}={value!r} is not accepted; expected one of {', '.join(accepted)}")

