"""A tiny document model for the web executor: stdlib ``html.parser`` plus a CSS subset.

Selectors (documented subset of CSS): a compound selector is ``tag``, ``#id``, ``.class`` or a
combination without spaces (``a.nav#home``, ``.btn.primary``, ``*``); compound selectors
separated by whitespace match descendants (``nav a.ext``). Nothing else (no ``>``, ``+``, ``~``,
attributes, pseudo-classes, commas): an unsupported selector raises ``SelectorError``.

Rendering (what SCREENSHOT hashes): the page's visible text laid out in a fixed 80x24 character
viewport starting at the scroll line, then drawn as a binary PGM image (one 8x8 cell per
character, a deterministic glyph pattern derived from the code point), so equal text always gives
byte-identical images.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Final

__all__ = [
    "VIEWPORT_COLUMNS",
    "VIEWPORT_ROWS",
    "Element",
    "SelectorError",
    "parse_html",
    "parse_selector",
    "render_pgm",
    "select",
    "visible_lines",
]

VIEWPORT_COLUMNS: Final = 80
VIEWPORT_ROWS: Final = 24
_CELL: Final = 8
_VOID: Final = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)
_BLOCK: Final = frozenset(
    {
        "p",
        "div",
        "section",
        "article",
        "header",
        "footer",
        "nav",
        "main",
        "ul",
        "ol",
        "li",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "table",
        "tr",
        "br",
        "hr",
        "pre",
        "form",
        "title",
        "body",
    }
)
_HIDDEN: Final = frozenset({"script", "style", "head", "template"})
_COMPOUND: Final = re.compile(
    r"(?P<tag>\*|[A-Za-z][A-Za-z0-9-]*)?(?P<rest>(?:[#.][A-Za-z0-9_-]+)*)"
)
_PART: Final = re.compile(r"([#.])([A-Za-z0-9_-]+)")
_SPACES: Final = re.compile(r"\s+")


class SelectorError(ValueError):
    """Raised when a selector is outside the supported CSS subset; ``selector`` is the input."""

    def __init__(self, selector: str, problem: str) -> None:
        self.selector = selector
        self.problem = problem
        super().__init__(f"unsupported selector {selector!r}: {problem}")


@dataclass(eq=False)
class Element:
    """An element of the parsed page; ``children`` holds elements and text strings in order."""

    tag: str
    attrs: dict[str, str]
    parent: Element | None = None
    children: list[Element | str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.attrs.get("id", "")

    @property
    def classes(self) -> frozenset[str]:
        return frozenset(self.attrs.get("class", "").split())

    def iter(self) -> list[Element]:
        """This element and every descendant element, in document order."""
        out: list[Element] = []
        stack: list[Element] = [self]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(c for c in reversed(node.children) if isinstance(c, Element))
        return out

    def text(self) -> str:
        """The element's text content with runs of whitespace collapsed to one space."""
        parts: list[str] = []
        stack: list[Element | str] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                parts.append(node)
            elif node.tag not in _HIDDEN or node is self:
                stack.extend(reversed(node.children))
        return _SPACES.sub(" ", "".join(parts)).strip()


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self._current = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, parent=self._current)
        self._current.children.append(element)
        if tag not in _VOID:
            self._current = element

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, parent=self._current)
        self._current.children.append(element)

    def handle_endtag(self, tag: str) -> None:
        node: Element | None = self._current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self._current = node.parent

    def handle_data(self, data: str) -> None:
        self._current.children.append(data)


def parse_html(source: str) -> Element:
    """Parse ``source`` into a tree; the returned root is a ``#document`` element."""
    builder = _TreeBuilder()
    builder.feed(source)
    builder.close()
    return builder.root


@dataclass(frozen=True, slots=True)
class _Compound:
    tag: str | None
    ids: tuple[str, ...]
    classes: frozenset[str]

    def matches(self, element: Element) -> bool:
        if self.tag is not None and element.tag != self.tag:
            return False
        if any(element.id != i for i in self.ids):
            return False
        return self.classes <= element.classes


def parse_selector(selector: str) -> tuple[_Compound, ...]:
    """Parse a selector of the supported subset (raises ``SelectorError``)."""
    parts = selector.split()
    if not parts:
        raise SelectorError(selector, "empty selector")
    compounds: list[_Compound] = []
    for part in parts:
        match = _COMPOUND.fullmatch(part)
        if match is None or not part:
            raise SelectorError(selector, f"{part!r} is not tag, #id or .class")
        tag = match["tag"]
        ids = tuple(v for k, v in _PART.findall(match["rest"]) if k == "#")
        classes = frozenset(v for k, v in _PART.findall(match["rest"]) if k == ".")
        compounds.append(_Compound(None if tag in (None, "*") else tag.lower(), ids, classes))
    return tuple(compounds)


def select(root: Element, selector: str) -> list[Element]:
    """Elements under ``root`` matching ``selector``, in document order."""
    chain = parse_selector(selector)
    last, ancestors = chain[-1], chain[:-1]
    found: list[Element] = []
    for element in root.iter():
        if element is root or not last.matches(element):
            continue
        if _ancestors_match(element.parent, ancestors):
            found.append(element)
    return found


def _ancestors_match(node: Element | None, chain: tuple[_Compound, ...]) -> bool:
    index = len(chain) - 1
    while index >= 0 and node is not None:
        if chain[index].matches(node):
            index -= 1
        node = node.parent
    return index < 0


def visible_lines(root: Element, *, width: int = VIEWPORT_COLUMNS) -> list[str]:
    """The page's visible text as lines: block elements break lines, long lines wrap."""
    lines: list[str] = []
    current: list[str] = []

    def flush() -> None:
        text = _SPACES.sub(" ", "".join(current)).strip()
        current.clear()
        while text:
            lines.append(text[:width])
            text = text[width:].lstrip()

    stack: list[Element | str | None] = [root]
    while stack:
        node = stack.pop()
        if node is None:
            flush()
        elif isinstance(node, str):
            current.append(node)
        elif node.tag not in _HIDDEN:
            if node.tag in _BLOCK:
                flush()
                stack.append(None)
            stack.extend(reversed(node.children))
    flush()
    return lines


def render_pgm(lines: list[str], *, scroll: int = 0) -> bytes:
    """Draw the 80x24 viewport starting at line ``scroll`` as a binary PGM (P5) image."""
    rows = [
        (lines[i] if 0 <= i < len(lines) else "").ljust(VIEWPORT_COLUMNS)[:VIEWPORT_COLUMNS]
        for i in range(scroll, scroll + VIEWPORT_ROWS)
    ]
    width, height = VIEWPORT_COLUMNS * _CELL, VIEWPORT_ROWS * _CELL
    pixels = bytearray(width * height)
    for row, text in enumerate(rows):
        for col, char in enumerate(text):
            if char == " ":
                continue
            code = ord(char)
            for y in range(1, _CELL - 1):
                bits = (code * (y + 3) * 2654435761) >> 7 & 0x3F
                base = (row * _CELL + y) * width + col * _CELL + 1
                for x in range(_CELL - 2):
                    if bits >> x & 1:
                        pixels[base + x] = 255
    return f"P5\n{width} {height}\n255\n".encode("ascii") + bytes(pixels)
