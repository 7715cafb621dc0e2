"""The README's errors table names exactly the error types the layer raises, each an IdempotencyError."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from idempotency_layer import errors

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_errors_table_lists_every_error_type_and_no_other():
    text = (ROOT / "README.md").read_text()
    table = text[text.index("**Errors**"):text.index("\n\n", text.index("| error |"))]
    rows = set(re.findall(r"^\| `(Idempotency[A-Za-z]+Error)` \|", table, re.M))
    raised = {name for name, value in inspect.getmembers(errors, inspect.isclass)
              if issubclass(value, errors.IdempotencyError) and value is not errors.IdempotencyError}
    assert rows == raised
    assert "each a subclass of\n`IdempotencyError`" in table
