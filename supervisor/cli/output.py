"""What the commands print: lines on stdout/stderr, indented JSON, plain aligned tables."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["err", "out", "table", "to_json"]


def out(text: str) -> None:
    """Write *text* to stdout as one line (a newline is added if missing)."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def err(text: str) -> None:
    """Write *text* to stderr as one line (a newline is added if missing)."""
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


def to_json(data: object) -> str:
    """*data* as indented JSON with sorted keys (what `--json` prints)."""
    import orjson

    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
