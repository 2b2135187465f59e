"""The `FleetStore` seam: what several daemons sharing one store need beyond `TurnStore`.

A shared engine (PostgreSQL) implements it; the embedded one (SQLite, one daemon) does not, and
the daemon then runs alone exactly as before.

Rules, on top of the `TurnStore` ones:

* **Session homes.** Every open session has one home daemon at a time, held under a lease like
  a turn's claim (owner, expiry, a token that only grows). Only the home appends to the
  session's two ledgers and runs its turns, so a session's hash chain stays one chain whichever
  daemon appends. A daemon opening a session is its first home; when a home stops renewing, any
  daemon that can run the session's package takes the home over (`claim_homes`) and rebuilds
  the session's ledger files from the store before it appends.
* **Anchored ledgers.** The store keeps every ledger line (never trimmed) and each ledger's
  head (seq, hash): the ledger of record. Lines reach it with a turn's ending (`finish`) or by
  `anchor_ledger_lines`. Both are fenced by the session's home: a line for a session this owner
  no longer homes is refused with `StaleHomeError` and nothing changes, and a different line for
  a seq already kept is refused as a fork.
* **Heartbeats.** Each daemon writes its heartbeat (`heartbeat`) while it runs; `daemons` lists
  them with the leases each holds.
* **Wake-ups.** `wait_for_work` returns early when another daemon accepted a turn nobody holds
  or asked for a resolution; callers still poll, so a lost notification never strands work.
* **Resolutions from anywhere.** A daemon that is not a session's home asks the home to carry
  out a terminate or cancel (`request_resolution`, with who asked: ``decided_by``); the home
  finds it in `pending_resolutions` and ends the turn with its ledger entries. A retry needs
  no ledger entry and is resolved directly (`TurnStore.resolve_escalation`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ledger.entries import SealedLine
from supervisor.store.protocol import Resolution, SessionRecord, TurnRecord

__all__ = [
    "DaemonRecord",
    "FleetStore",
    "LedgerHead",
    "SessionHome",
    "StaleHomeError",
]


class StaleHomeError(Exception):
    """A ledger write for a session this owner no longer homes (another daemon took it over)."""

    def __init__(self, session_id: str, *, owner: str, home: str | None) -> None:
        self.session_id = session_id
        self.owner = owner
        self.home = home
        super().__init__(
            f"session {session_id} is homed by {home or 'nobody'}, not by {owner}: its ledger"
            " write was refused"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionHome:
    """A daemon's right to append to a session's ledgers and run its turns until
    ``lease_until_us``."""

    session: SessionRecord
    owner: str
    token: int
    lease_until_us: int

    @property
    def session_id(self) -> str:
        return self.session.session_id


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonRecord:
    """One daemon as its last heartbeat described it."""

    owner: str
    host: str
    pid: int
    started_us: int
    heartbeat_us: int
    #: leases held now (counted by the store, not reported by the daemon)
    turns_held: int
    sessions_homed: int
    #: what the daemon reported about itself (command types served, executors ready, ...)
    info: Mapping[str, object]

    def to_dict(self) -> dict[str, object]:
        return {
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "started_us": self.started_us,
            "heartbeat_us": self.heartbeat_us,
            "turns_held": self.turns_held,
            "sessions_homed": self.sessions_homed,
            "info": dict(self.info),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerHead:
    ledger_id: str
    seq: int
    entry_hash: str


class FleetStore(Protocol):
    """Session homes, heartbeats, anchored ledgers and wake-ups (see the module docstring)."""

    async def home_session(self, session_id: str, owner: str, *, lease_ms: int) -> SessionHome:
        """Make *owner* the home of a session nobody homes (just opened, or its home's lease
        expired); `StaleHomeError` when another daemon's lease still holds it."""
        ...

    async def claim_homes(
        self,
        owner: str,
        *,
        lease_ms: int,
        limit: int,
        packages: frozenset[str] | None,
        serves: frozenset[str] | None = None,
    ) -> list[SessionHome]:
        """Take the home of up to *limit* open sessions whose home's lease expired (or that
        have none), of the given packages (None: any). A session handed over
        (`release_home` with *reserve_ms*) is taken during its reservation only by a daemon
        whose executors *serve* every command type of its waiting instruction turns."""
        ...

    async def renew_homes(
        self, homes: Sequence[SessionHome], *, lease_ms: int
    ) -> list[SessionHome]:
        """Extend the homes still held; the ones lost meanwhile are left out."""
        ...

    async def release_home(self, home: SessionHome, *, reserve_ms: int | None = None) -> None:
        """Give the home up (taken at once by the next round of any daemon). *reserve_ms*: a
        hand-over; for that long, only a daemon that serves the command types of the
        session's waiting instruction turns takes it (`claim_homes`)."""
        ...

    async def session_homes(self, session_ids: Sequence[str] | None = None) -> dict[str, str]:
        """The daemon homing each of these sessions (all when None) that has a home now: open
        and not released (a lapsed home still names its daemon until it is taken over)."""
        ...

    async def waiting_turns(self, owner: str, session_ids: Sequence[str]) -> list[tuple[str, str]]:
        """``(session_id, command_type)`` of the instruction turns of these sessions that
        wait to run (accepted, waiting for a retry, or running under a lapsed claim), not held
        by another daemon's live claim; each pair once."""
        ...

    async def anchor_ledger_lines(self, owner: str, lines: Sequence[SealedLine]) -> None:
        """Keep lines of sessions *owner* homes (fenced; idempotent for lines already kept)."""
        ...

    async def ledger_heads(self, ledger_ids: Sequence[str] | None = None) -> list[LedgerHead]:
        """The anchored heads (all ledgers when None)."""
        ...

    async def heartbeat(
        self, owner: str, *, host: str, pid: int, started_us: int, info: Mapping[str, object]
    ) -> None: ...

    async def daemons(self) -> list[DaemonRecord]:
        """Every daemon that wrote a heartbeat, newest first."""
        ...

    async def forget_daemon(self, owner: str) -> None:
        """Remove a daemon's heartbeat row (a clean stop)."""
        ...

    async def request_resolution(
        self,
        turn_id: int,
        resolution: Resolution,
        *,
        decided_by: Mapping[str, object] | None = None,
    ) -> TurnRecord:
        """Ask the session's home to end an escalated turn (`NotEscalatedError` if it is not);
        *decided_by*: who asked and why, handed to the home with the resolution."""
        ...

    async def pending_resolutions(
        self, session_ids: Sequence[str]
    ) -> list[tuple[TurnRecord, Resolution, Mapping[str, object] | None]]:
        """The resolutions asked of these sessions' home: each turn, what was asked and who
        asked (`request_resolution`'s *decided_by*)."""
        ...

    async def wait_for_work(self, timeout_s: float) -> bool:
        """Sleep until another daemon signals new work, or *timeout_s*; True when signalled."""
        ...
