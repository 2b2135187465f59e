"""A turn's entries in its session's ledger files, as ``turn.get`` shows them (`hunter turn
show`, the console's turn page, `hunter mcp`'s decision records).

A session's ledgers grow with every turn, and a turn's entries are almost always among the
last ones: the file is read backwards, in blocks, the turn's lines found by a compiled pattern
(``"turn_number":N`` then ``,`` or ``}``: 3-4 GB/s here, where ``bytes.find`` ran at 0.6 among
the hex digits of the hashes) and only those parsed. The search stops once a block begins with
entries sealed well before the turn was accepted (`CLOCK_MARGIN_US`): entries are appended in
seq order, and every entry of a turn is sealed after its acceptance. Reading line by line from
the start cost about 5 µs a line: 1.5 ms for a session of 320 turns, 45 ms for 10,000 (now 0.2
and 6 ms when every entry is recent, less when the turn's are).

Read only, on a worker thread. A line that does not parse (one being appended) is skipped;
``hunter check-ledgers`` is what verifies the chains.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

import orjson

__all__ = ["CLOCK_MARGIN_US", "turn_ledger_entries"]

#: What `turn.get` shows of each of the turn's ledger entries (the hashes and what they seal).
_LEDGER_FIELDS: Final = (
    "seq",
    "kind",
    "ts_us",
    "entry_hash",
    "previous_hash",
    "query_hash",
    "result_hash",
    "status",
    "decided_by",  # an evidence entry's: who decided a cancel or an operator's terminate
    "requested_by",  # an evidence entry's: who asked, through a front end (`hunter mcp`)
)

#: How long before a turn's acceptance the backward search still looks, by the entries' wall
#: clock: room for a clock stepped back, or another daemon's clock behind the one that
#: accepted the turn (a fleet). Older entries are never read for it.
CLOCK_MARGIN_US: Final = 10 * 60 * 1_000_000
_BLOCK: Final = 32 * 1024
_TS: Final = b'"ts_us":'


def turn_ledger_entries(
    session_dir: Path, turn_number: int, accepted_us: int | None = None
) -> dict[str, list[dict[str, object]]]:
    """``{"exec": [...], "evidence": [...]}``: the entries of *turn_number* in the session's
    ledger files, in seq order. With *accepted_us* (the turn's acceptance) the search stops at
    entries sealed `CLOCK_MARGIN_US` before it; without, it reads the whole files."""
    since = None if accepted_us is None else accepted_us - CLOCK_MARGIN_US
    needle = re.compile(rb'"turn_number":%d[,}]' % turn_number)
    return {
        name: _entries(session_dir / "ledger" / f"{name}.jsonl", needle, turn_number, since)
        for name in ("exec", "evidence")
    }


def _entries(
    path: Path, needle: re.Pattern[bytes], turn_number: int, since_us: int | None
) -> list[dict[str, object]]:
    found: dict[int, dict[str, object]] = {}  # by the line's place in the file
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return []
    with fh:
        end = fh.seek(0, os.SEEK_END)
        carry = b""  # the start of a later block up to its first newline: ends a line here
        while end > 0:
            start = max(0, end - _BLOCK)
            fh.seek(start)
            data = fh.read(end - start) + carry
            end = start
            carry = b""
            if start > 0:  # the first line may begin in an earlier block: keep it for that one
                cut = data.find(b"\n")
                if cut < 0:
                    carry = data
                    continue
                carry, data = data[:cut], data[cut + 1 :]
            _collect(data, start + len(carry), needle, turn_number, found)
            if since_us is not None and _first_ts(data) < since_us:
                break
    return [found[place] for place in sorted(found)]


def _collect(
    data: bytes,
    offset: int,
    needle: re.Pattern[bytes],
    turn_number: int,
    found: dict[int, dict[str, object]],
) -> None:
    """Parse each line of *data* (whole lines; *offset*: where *data* begins in the file)
    that holds the needle; keep the turn's entries by their place in the file."""
    pos = 0
    while (match := needle.search(data, pos)) is not None:
        first = data.rfind(b"\n", 0, match.start()) + 1
        last = data.find(b"\n", match.end())
        last = len(data) if last < 0 else last
        try:
            entry = orjson.loads(data[first:last])
        except orjson.JSONDecodeError:
            entry = None
        if isinstance(entry, dict) and entry.get("turn_number") == turn_number:
            found[offset + first] = {k: entry[k] for k in _LEDGER_FIELDS if k in entry}
        pos = last


def _first_ts(data: bytes) -> int:
    """The ``ts_us`` of the first line of *data*; a line without one never stops the search."""
    newline = data.find(b"\n")
    line = data if newline < 0 else data[:newline]
    at = line.find(_TS)
    if at < 0:
        return 1 << 63
    digits = line[at + len(_TS) :].split(b",", 1)[0].split(b"}", 1)[0].strip()
    try:
        return int(digits)
    except ValueError:
        return 1 << 63
