"""Where a session's ledgers live: ``<root>/planes/<tier>/sessions/<sid>``, and the gate that
both of them are there (seed 004 FR-RT-018).

Its own module because the daemon, the CLI and the console find a session's directory without
opening its ledgers; the tier and session id become directory names, so they are checked here.
"""

from __future__ import annotations

from pathlib import Path

from ledger.errors import LedgerRecordError
from ledger.verify import session_ledger_paths

__all__ = ["both_ledgers_exist", "session_dir_for"]


def _check_name(what: str, value: str) -> str:
    if (
        not value
        or value in {".", ".."}
        or "/" in value
        or "\\" in value
        or not value.isascii()
        or not value.isprintable()
        or any(char.isspace() for char in value)
    ):
        raise LedgerRecordError(what, f"{value!r} cannot name a directory")
    return value


def session_dir_for(root: Path, tier: str, session_id: str) -> Path:
    """``<root>/planes/<tier>/sessions/<sid>``."""
    return (
        Path(root)
        / "planes"
        / _check_name("tier", tier)
        / "sessions"
        / _check_name("session_id", session_id)
    )


def both_ledgers_exist(session_dir: Path) -> bool:
    """The FR-RT-018 gate: a valid session has both ``exec.jsonl`` and ``evidence.jsonl``."""
    return all(path.is_file() for path in session_ledger_paths(session_dir))
