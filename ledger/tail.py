"""Reading a ledger file's sealed lines from a byte offset on (what a daemon in a fleet anchors
in the shared store). Only whole lines are returned: a line still being written (no newline yet)
is left for the next read."""

from __future__ import annotations

from pathlib import Path

import orjson

from ledger.entries import SealedLine
from ledger.errors import IntegrityError

__all__ = ["read_sealed_lines"]


def read_sealed_lines(path: Path, ledger_id: str, offset: int = 0) -> tuple[list[SealedLine], int]:
    """The whole lines of *path* from byte *offset* on, and the offset after the last one.

    Raises `IntegrityError` for a line that is not a sealed entry of *ledger_id* (the file was
    damaged or is another ledger's).
    """
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n") + 1
    lines: list[SealedLine] = []
    start = 0
    number = 0
    while start < end:
        stop = data.index(b"\n", start) + 1
        raw = data[start:stop]
        number += 1
        start = stop
        if not raw.strip():
            continue
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise IntegrityError(path, number, None, f"not a JSON entry: {exc}") from None
        if not isinstance(entry, dict):
            raise IntegrityError(path, number, None, "not a JSON object")
        seq, digest = entry.get("seq"), entry.get("entry_hash")
        if entry.get("ledger_id") != ledger_id or type(seq) is not int or type(digest) is not str:
            raise IntegrityError(path, number, None, f"not a sealed entry of ledger {ledger_id}")
        previous = entry.get("previous_hash")
        lines.append(
            SealedLine(
                ledger_id, seq, digest, bytes(raw), previous if type(previous) is str else ""
            )
        )
    return lines, offset + end
