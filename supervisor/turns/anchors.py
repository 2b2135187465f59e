"""A fleet daemon's ledger anchoring: every line its sessions' ledger files get also reaches the
shared store, the ledger of record, before anything after it is acknowledged.

Most lines get there with their turn's ending (`TurnStore.finish`, one transaction). The sandbox
runtime also writes lines of its own straight to the files: the ``session_opened`` pair, the
violation entries of a refused request or of a running process turn, a rejection's pair. Those
are read back from the files (from the byte offset anchored so far) and sent with the next
ending of the session, or on their own (`anchor`) at the points where the daemon acknowledges
them (a session opened, a request refused) and in the ledger sync round as a safety net. The
store keeps a line once and refuses a different one at a kept seq, so sending a line twice is
harmless.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread
import orjson

from ledger.entries import SealedLine
from ledger.errors import IntegrityError
from ledger.tail import read_sealed_lines
from supervisor.store.fleet import FleetStore
from supervisor.store.sealing import Chained, LineSeal
from supervisor.turns.sessions import SessionLike

__all__ = ["LedgerAnchors", "Tail"]


@dataclass(frozen=True, slots=True)
class Tail:
    """Lines the files hold past the anchored offsets, and the offsets after them."""

    session_id: str
    lines: tuple[SealedLine, ...]
    offsets: tuple[tuple[str, int], ...]


def _paths(session: SessionLike) -> tuple[tuple[str, Path], tuple[str, Path]]:
    exec_id, evidence_id = session.ledger_ids
    exec_path = session.exec_ledger_path
    return (exec_id, exec_path), (evidence_id, exec_path.with_name("evidence.jsonl"))


def _last_seq(path: Path, ledger_id: str, size: int) -> int | None:
    """The seq of the last whole line in the first *size* bytes of a ledger file (None: no
    line there). Only those bytes: the file may grow meanwhile."""
    window = 65536
    while True:
        start = max(0, size - window)
        with path.open("rb") as handle:
            handle.seek(start)
            data = handle.read(size - start)
        end = data.rfind(b"\n")
        begin = data.rfind(b"\n", 0, end) + 1 if end >= 0 else -1
        if end >= 0 and (begin > 0 or start == 0):
            entry = orjson.loads(data[begin : end + 1])
            if not isinstance(entry, dict) or entry.get("ledger_id") != ledger_id:
                raise IntegrityError(path, 0, None, f"not a sealed entry of ledger {ledger_id}")
            seq = entry.get("seq")
            return seq if type(seq) is int else None
        if start == 0:
            return None
        window *= 16


class LedgerAnchors:
    """Byte offsets up to which each loaded ledger file is anchored in the shared store."""

    def __init__(self, store: FleetStore, owner: str) -> None:
        self._store = store
        self._owner = owner
        self._offsets: dict[str, int] = {}
        #: the seq of the line that starts at the anchored offset, per ledger, when known: the
        #: lines an ending commits move the offset past themselves (`noted`)
        self._next_seq: dict[str, int] = {}
        #: the highest seq known to be in the store, per ledger (skips idle sync rounds)
        self._high: dict[str, int] = {}

    def adopted(self, session: SessionLike) -> None:
        """The session's files were just built from (or checked against) the store: all of
        what they hold is anchored."""
        for ledger_id, path in _paths(session):
            size = path.stat().st_size
            self._offsets[ledger_id] = size
            last = _last_seq(path, ledger_id, size)
            if last is None:
                self._next_seq.pop(ledger_id, None)
            else:
                self._next_seq[ledger_id] = last + 1

    def forget(self, session: SessionLike) -> None:
        for ledger_id in session.ledger_ids:
            self._offsets.pop(ledger_id, None)
            self._next_seq.pop(ledger_id, None)
            self._high.pop(ledger_id, None)

    def behind(self, ledger_id: str, seq: int) -> bool:
        """True when the file's durable *seq* is past what the store is known to hold."""
        return seq > self._high.get(ledger_id, 0)

    async def pending(self, session: SessionLike) -> Tail:
        """The whole lines the session's files hold past the anchored offsets (a worker
        thread)."""
        wanted = [
            (ledger_id, path, self._offsets.get(ledger_id, 0))
            for ledger_id, path in _paths(session)
        ]

        def read() -> Tail:
            lines: list[SealedLine] = []
            offsets: list[tuple[str, int]] = []
            for ledger_id, path, offset in wanted:
                found, end = read_sealed_lines(path, ledger_id, offset)
                lines.extend(found)
                offsets.append((ledger_id, end))
            return Tail(session.session_id, tuple(lines), tuple(offsets))

        return await anyio.to_thread.run_sync(read)

    def advance(self, tail: Tail) -> None:
        """*tail*'s lines are in the store now."""
        last: dict[str, int] = {}
        for x in tail.lines:
            last[x.ledger_id] = max(last.get(x.ledger_id, 0), x.seq)
        for ledger_id, end in tail.offsets:
            if end > self._offsets.get(ledger_id, 0):
                self._offsets[ledger_id] = end
                if ledger_id in last:  # the file's lines are in seq order: its last one
                    self._next_seq[ledger_id] = last[ledger_id] + 1
                else:
                    self._next_seq.pop(ledger_id, None)
        self.noted(tail.lines)

    def noted(self, lines: Iterable[SealedLine]) -> None:
        """*lines* are in the store now. The anchored offset of a ledger moves past those of
        them that come next in its file (each line's bytes are exactly the file's), so the
        next `pending` does not read them again; a line the store has not got (one the
        runtime wrote itself) stops it there."""
        by_ledger: dict[str, list[SealedLine]] = {}
        for x in lines:
            if x.seq > self._high.get(x.ledger_id, 0):
                self._high[x.ledger_id] = x.seq
            by_ledger.setdefault(x.ledger_id, []).append(x)
        for ledger_id, found in by_ledger.items():
            offset, following = self._offsets.get(ledger_id), self._next_seq.get(ledger_id)
            if offset is None or following is None:
                continue
            for x in sorted(found, key=lambda line: line.seq):
                if x.seq < following:
                    continue
                if x.seq > following:
                    break
                offset += len(x.line)
                following += 1
            self._offsets[ledger_id], self._next_seq[ledger_id] = offset, following

    async def anchor(self, session: SessionLike) -> int:
        """Send what the files hold past the anchored offsets; how many lines were sent."""
        tail = await self.pending(session)
        if tail.lines:
            await self._store.anchor_ledger_lines(self._owner, tail.lines)
        self.advance(tail)
        return len(tail.lines)

    async def with_pending(
        self, session: SessionLike | None, lines: LineSeal
    ) -> tuple[LineSeal, Tail | None]:
        """*lines* (an ending's, sealed by the store after its fence) after the lines the
        files hold that the store may not have yet: they commit together."""
        if session is None:
            return lines, None
        tail = await self.pending(session)
        return Chained(tail.lines, lines), tail
