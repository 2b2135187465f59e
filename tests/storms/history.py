"""The history of a nemesis run: every operation's invocation and completion, every fault.

Jepsen's shape: the generator records an ``invoke`` line when it sends a request and one
completion line when the answer (or its absence) is known: ``ok`` (acknowledged: the turn id),
``fail`` (the daemon refused it: it did nothing) or ``info`` (indeterminate: a timeout or a lost
connection, the daemon may or may not have accepted it). The nemesis records each fault's
``start`` and ``end`` and what it measured (``takeover``). Lines are JSON, written (and flushed)
as they happen, with ``t``: seconds since the run began (monotonic clock), and ``wall``: the
UNIX time, so that they line up with the daemons' and the server's logs.

The checker reads the file back (`read_history`); nothing but the file passes between them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Literal

import orjson

__all__ = ["COMPLETIONS", "History", "Op", "read_history"]

Completion = Literal["ok", "fail", "info"]
COMPLETIONS: Final = frozenset({"ok", "fail", "info"})


@dataclass(frozen=True, slots=True)
class Op:
    """One control call of the generator, invocation and completion paired (`read_history`)."""

    #: the call's id in the history (unique per run)
    call: int
    key: str
    daemon: str
    kind: str
    session_id: str
    #: 1 for the first submission of the key, then one more for each resubmission
    attempt: int
    invoked: float
    #: None: never completed (the run ended first)
    completed: float | None
    type: str
    turn_id: int | None
    created: bool | None
    error: str
    code: str

    @property
    def latency_s(self) -> float | None:
        return None if self.completed is None else self.completed - self.invoked


class History:
    """Appends the run's events to a JSON-lines file as they happen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._started = time.monotonic()
        self._file: IO[bytes] = path.open("ab")
        self._calls = 0

    def now(self) -> float:
        """Seconds since the run began."""
        return time.monotonic() - self._started

    def record(self, type_: str, **fields: Any) -> float:
        """Write one event (``type`` *type_*, *fields*); returns its ``t``."""
        t = self.now()
        line = {"type": type_, "t": round(t, 6), "wall": round(time.time(), 6), **fields}
        self._file.write(orjson.dumps(line) + b"\n")
        self._file.flush()
        return t

    def invoke(self, **fields: Any) -> int:
        """Record a request being sent; returns the call id its completion names."""
        self._calls += 1
        self.record("invoke", call=self._calls, **fields)
        return self._calls

    def complete(self, call: int, type_: Completion, **fields: Any) -> None:
        """Record the completion of call *call*: ``ok``, ``fail`` or ``info``."""
        self.record(type_, call=call, **fields)

    def close(self) -> None:
        self._file.close()


def _events(path: Path) -> Iterator[dict[str, Any]]:
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                event = orjson.loads(line)
                if isinstance(event, dict):
                    yield event


def read_history(path: Path) -> tuple[list[Op], list[dict[str, Any]]]:
    """The generator's calls (invocations paired with their completions, by call id) and every
    other event (faults, measurements), in the order written."""
    invoked: dict[int, Mapping[str, Any]] = {}
    done: dict[int, Mapping[str, Any]] = {}
    others: list[dict[str, Any]] = []
    for event in _events(path):
        if event["type"] == "invoke":
            invoked[int(event["call"])] = event
        elif event["type"] in COMPLETIONS and "call" in event:
            done[int(event["call"])] = event
        else:
            others.append(event)
    ops: list[Op] = []
    for call, inv in sorted(invoked.items()):
        end = done.get(call)
        turn_id = end.get("turn_id") if end is not None else None
        created = end.get("created") if end is not None else None
        ops.append(
            Op(
                call=call,
                key=str(inv["key"]),
                daemon=str(inv["daemon"]),
                kind=str(inv["kind"]),
                session_id=str(inv["session_id"]),
                attempt=int(inv["attempt"]),
                invoked=float(inv["t"]),
                completed=float(end["t"]) if end is not None else None,
                type=str(end["type"]) if end is not None else "pending",
                turn_id=int(turn_id) if turn_id is not None else None,
                created=bool(created) if created is not None else None,
                error=str(end.get("error", "")) if end is not None else "",
                code=str(end.get("code", "")) if end is not None else "",
            )
        )
    return ops, others
