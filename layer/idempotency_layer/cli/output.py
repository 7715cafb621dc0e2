"""Printing for the CLI: one formatter per command's facts, for people (text) or scripts (`--json`)."""

from __future__ import annotations

import json
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def utc(epoch_s: float | None) -> str | None:
    """An epoch time in seconds as ISO 8601 UTC, or None."""
    if epoch_s is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


def relative(epoch_s: float, now: float) -> str:
    """'in 4m 10s' or '3h 2m ago': the two largest units, as an operator reads them."""
    seconds = round(epoch_s - now)
    if seconds == 0:
        return "now"
    left = abs(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
        if len(parts) == 2:
            break
    text = " ".join(parts)
    return f"in {text}" if seconds > 0 else f"{text} ago"


def when(stored: float | None, now: float, per_second: int = 1) -> dict[str, Any] | None:
    """An instant stored as `per_second` units since the epoch, as both scripts and people read it. A number
    no calendar can show (a hand-edited item) keeps its raw value, marked out of range."""
    if stored is None:
        return None
    try:
        epoch_s = stored / per_second if per_second != 1 else stored
        return {"utc": utc(epoch_s), "epoch": epoch_s, "relative": relative(epoch_s, now)}
    except (OverflowError, OSError, ValueError):
        return {"utc": None, "epoch": stored, "relative": None, "out_of_range": True}


def said(moment: dict[str, Any] | None) -> str:
    if moment is None:
        return "-"
    if moment.get("out_of_range"):
        return f"{moment['epoch']} (out of range)"
    return f"{moment['utc']} ({moment['relative']})"


def clean(value: Any) -> str:
    """A stored string as one line of plain text: control characters escaped (`\\n`, `\\x1b`), so an
    attribute cannot forge lines or reach the terminal."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def finite(value: Any) -> Any:
    """`value` with NaN and the infinities as the strings "NaN", "Infinity", "-Infinity" (JSON has none)."""
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def jsonable(value: Any) -> Any:
    """A decoded result's values JSON has no type for (Decimal, bytes), as text."""
    if isinstance(value, bytes):
        import base64

        return {"$bytes": base64.b64encode(value).decode()}
    return str(value)


def emit(facts: Any, as_json: bool, text: Any) -> None:
    """Print `facts` as one JSON document, or as the lines `text(facts)` gives."""
    if as_json:
        sys.stdout.write(json.dumps(facts, default=jsonable, ensure_ascii=False) + "\n")
    else:
        for line in text(facts):
            sys.stdout.write(line + "\n")
