"""Every relative link in README.md and docs/*.md resolves: the file exists and, for `#anchor`, a heading of that
file makes that anchor (GitHub's rule). Every page in docs/ is linked from the README.
User docs quote no commit hashes: evidence says its date and the command that produced it. The README stays within
350 lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lower-cased, punctuation but `-` and `_` dropped,
    spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(path.read_text()):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    # Over the whole text: a link's text may run over a line break.
    return LINK.findall("\n".join(CODE_SPAN.sub("", line) for line in _prose(path.read_text())))


def test_slug_follows_github() -> None:
    assert slug("HTTP: API Gateway, Function URLs, ALB") == "http-api-gateway-function-urls-alb"
    assert slug("Benchmark: this layer against Powertools `@idempotent`") == (
        "benchmark-this-layer-against-powertools-idempotent")
    assert slug("Batches: SQS, Kinesis, DynamoDB Streams") == "batches-sqs-kinesis-dynamodb-streams"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        name, _, anchor = target.partition("#")
        file = (page.parent / name).resolve() if name else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"{target}: no heading makes #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_doc_is_linked_from_the_readme() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md") if not t.startswith("#")}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs not linked from README.md: {missing}"


# A short or full commit hash: hex of 7 to 40, with a letter and a digit, not part of a longer word or a UUID.
HASH = re.compile(r"(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_commit_hashes(page: Path) -> None:
    assert not HASH.findall(page.read_text()), f"{page.relative_to(ROOT)} quotes a commit"


def test_the_hash_check_finds_a_hash() -> None:
    assert HASH.findall("the default soak at 74cf4b5, and 835f51c.") == ["74cf4b5", "835f51c"]
    assert not HASH.findall("a key such as 8e03978e-40d5-43e8-bc93-6894a57f9324, 1234567 requests")


README_LINES = 350


def test_the_readme_is_at_most_350_lines() -> None:
    # The README is the user's guide (quick start, settings, errors, limits); the rest lives in docs/, linked.
    lines = (ROOT / "README.md").read_text().count("\n")  # as `wc -l` counts
    assert lines <= README_LINES, f"README.md is {lines} lines, over {README_LINES}: move a section to docs/"
