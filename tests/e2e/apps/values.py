"""Result types the runtime's marshaller accepts beyond plain JSON, importable by the function and the tests
(pickled values travel in events), so each side builds the same values."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple


class Colour(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(NamedTuple):
    x: int
    y: Any


class Row:
    """Not a tuple, yet has _asdict(): the runtime marshals it as an object."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields

    def _asdict(self) -> dict[str, Any]:
        return dict(self.fields)


def deep(depth: int) -> Any:
    value: Any = {"leaf": 1}
    for i in range(depth):
        value = [value] if i % 2 else {"d": value}
    return value
