"""The repository's documents stand on their own (issue 21): README.md and every document
under docs/ send the reader only to files the repository has.

* Every Markdown link (``[text](target)``, ``[text]: target``) that is not a URL names a file
  or folder inside the repository, relative to the document, and its ``#anchor``, if any, a
  heading of the document it names.
* Every Markdown file a document mentions, linked or not (``docs/policy.md``, ``DESIGN.md``),
  is one the repository has (relative to the document or to the repository's root), or one its
  own programs write (a string literal of its Python code, e.g. the ``report.md`` of
  ``benchmarks/compare.py``). Several documents once sent the reader to a ``DESIGN.md`` that was
  never part of the repository.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]
_DOCS = (_REPO / "README.md", *sorted((_REPO / "docs").rglob("*.md")))
_CODE_DIRS = ("supervisor", "sandbox", "ledger", "benchmarks", "scripts", "examples")

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_INLINE_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
_MD_NAME = re.compile(r"(?<![\w./-])((?:\.{1,2}/)*[\w-][\w./-]*\.md)\b")


def _relative(path: Path) -> str:
    return str(path.relative_to(_REPO))


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@cache
def _anchors(doc: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    anchors = set()
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(anchors)


@cache
def _written_names() -> frozenset[str]:
    """File names the repository's programs write: string literals that are a bare name."""
    names = set()
    for folder in _CODE_DIRS:
        for source in (_REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                value = node.value if isinstance(node, ast.Constant) else None
                if isinstance(value, str) and re.fullmatch(r"[\w.-]+\.md", value):
                    names.add(value)
    return frozenset(names)


def _links(doc: Path) -> Iterator[str]:
    text = _CODE_SPAN.sub("", _FENCE.sub("", doc.read_text(encoding="utf-8")))
    yield from _INLINE_LINK.findall(text)
    yield from _REFERENCE.findall(text)


def _broken(doc: Path, target: str) -> str | None:
    """Why *target*, a link of *doc*, leads nowhere (None: it leads where it says)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
        return None
    path_part, _, anchor = target.partition("#")
    linked = (doc.parent / path_part).resolve() if path_part else doc
    if linked != _REPO and _REPO not in linked.parents:
        return "is outside the repository"
    if not linked.exists():
        return "does not exist"
    if anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
        return f"has no heading #{anchor} in {_relative(linked)}"
    return None


@pytest.mark.parametrize("doc", _DOCS, ids=_relative)
def test_every_link_leads_to_a_file_of_the_repository(doc: Path) -> None:
    """Each link of the document names an existing file of the repository (and heading)."""
    broken = [f"{t} {why}" for t in _links(doc) if (why := _broken(doc, t)) is not None]
    assert not broken, f"{_relative(doc)} links to what the repository lacks: {broken}"


@pytest.mark.parametrize("doc", _DOCS, ids=_relative)
def test_every_markdown_file_mentioned_is_in_the_repository(doc: Path) -> None:
    """Each `*.md` the document names is a file of the repository, or one its code writes."""
    text = _URL.sub("", doc.read_text(encoding="utf-8"))
    missing = sorted(
        {
            name
            for name in _MD_NAME.findall(text)
            if not (doc.parent / name).exists()
            and not (_REPO / name).exists()
            and Path(name).name not in _written_names()
        }
    )
    assert not missing, f"{_relative(doc)} names Markdown files the repository lacks: {missing}"


def test_the_checks_catch_what_issue_21_found() -> None:
    """The rules above, on the kinds of reference the documents once had."""
    doc = _REPO / "docs" / "policy.md"
    assert _broken(doc, "DESIGN.md") == "does not exist"
    assert _broken(doc, "../../shared/DESIGN.md") == "is outside the repository"
    assert _broken(doc, "protocol.md#no-such-heading") == (
        "has no heading #no-such-heading in docs/protocol.md"
    )
    assert _broken(doc, "protocol.md#2-frames") is None
    assert _broken(doc, "#how-the-seeds-combine") is None
    assert _broken(doc, "https://example.com/DESIGN.md") is None
    assert _MD_NAME.findall('the mapping of DESIGN.md "How the seeds fit together"') == [
        "DESIGN.md"
    ]
    assert "DESIGN.md" not in _written_names()
    assert "report.md" in _written_names()
