"""The shapes of the control API's answers: a turn (its whole record, or with
``answer="compact"`` its outcome only), a turn's ledger entries as ``turn.get`` shows them, and
an executor as ``executors.list`` and ``status`` show it. `supervisor.control.server` builds
its answers from these; docs/control-protocol.md describes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from supervisor.store.protocol import TurnRecord
from supervisor.wire.control import TurnAnswer

__all__ = [
    "EvidenceMissing",
    "compact_turn",
    "evidence_slice",
    "executor_answer",
    "package_answer",
    "statistics_answer",
    "turn_answer",
]


def turn_answer(turn: TurnRecord, answer: TurnAnswer = "full") -> dict[str, object]:
    """The turn object of an answer: the whole record, or with ``answer="compact"`` only its
    outcome (`compact_turn`). Each attempt of the whole record also says how long it waited
    for a slot before it ran (``queued_ms``: `AttemptRecord.queued_ms`, null when unknown)."""
    if answer != "full":
        return compact_turn(turn)
    data = turn.to_dict()
    shown = data["attempts"]
    assert isinstance(shown, list)
    for entry, attempt in zip(shown, turn.attempts, strict=True):
        entry["queued_ms"] = attempt.queued_ms
    return data


def compact_turn(turn: TurnRecord) -> dict[str, object]:
    """The compact turn object (``answer: "compact"`` of ``turn.submit`` and ``turn.wait``):
    ``turn_id``, ``session_id``, ``turn_number``, ``state``, ``verdict``, ``reason_code``,
    ``attempt`` (as in the full object) and ``evidence_hash``: the executor's sha256 of its
    evidence bytes, the full object's ``result.evidence_hash``; null when there is none (a
    process turn, no accepted response, an empty one). It is not the exec ledger's
    ``result_hash``: that one digests the result with the decision as sealed and is only read
    from the ledger (``turn.get``)."""
    result = turn.result
    evidence_hash = result.get("evidence_hash") if result is not None else None
    if not isinstance(evidence_hash, str) or not evidence_hash:
        evidence_hash = None
    return {
        "turn_id": turn.turn_id,
        "session_id": turn.session_id,
        "turn_number": turn.turn_number,
        "state": turn.state.value,
        "verdict": turn.verdict,
        "reason_code": turn.reason_code,
        "attempt": turn.attempt,
        "evidence_hash": evidence_hash,
    }


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        return [_plain(v) for v in value]
    enum_value = getattr(value, "value", None)
    if enum_value is not None and not isinstance(value, int | float | str | bool):
        return enum_value
    return value


def executor_answer(info: Any) -> dict[str, object]:
    """An executor (`ExecutorInfo`) as ``executors.list`` and ``status`` show it."""
    return statistics_answer(info)


def statistics_answer(stats: Any) -> dict[str, object]:
    """A frozen dataclass (statistics, an executor) as plain JSON values (enums by value)."""
    data = _plain(asdict(stats))
    assert isinstance(data, dict)
    return data


class EvidenceMissing(Exception):
    """Raised by `evidence_slice` when the turn has no stored evidence bytes (the message says
    why, for the ``no_evidence`` error)."""


def evidence_slice(
    session_dir: Path, result: Mapping[str, object] | None, offset: int, length: int
) -> dict[str, object]:
    """``turn.evidence``'s answer: *length* bytes from *offset* of the evidence bytes recorded
    in the turn's *result* (``result.evidence``: ``{sha256, size, path}``, *path* under
    *session_dir*), base64; on a worker thread. The path must stay inside the session's
    directory (a record cannot make the daemon read elsewhere)."""
    import base64

    ref = (result or {}).get("evidence")
    if not isinstance(ref, Mapping) or not isinstance(ref.get("path"), str):
        raise EvidenceMissing(
            "the turn has no stored evidence bytes (its executor sent only a hash, or none)"
        )
    base = session_dir.resolve()
    path = (base / str(ref["path"])).resolve()
    if not path.is_relative_to(base):
        raise EvidenceMissing(f"the evidence path {ref['path']!r} leaves the session's directory")
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(min(offset, size))
            data = fh.read(length)
    except FileNotFoundError:
        raise EvidenceMissing(
            f"the evidence file {ref['path']} is not on this daemon's root"
        ) from None
    return {
        "sha256": ref.get("sha256"),
        "size": size,
        "offset": offset,
        "data": base64.b64encode(data).decode("ascii"),
        "more": offset + len(data) < size,
    }


def package_answer(manifest: Path) -> dict[str, object]:
    """``session.get``'s package part (a worker thread): ``{package: the manifest's effective
    capabilities and limits, package_problem: null}``, or ``package`` null and
    ``package_problem`` saying why (uninstalled since, invalid)."""
    from sandbox.errors import ManifestError
    from sandbox.packages import load_manifest

    if not manifest.exists():
        problem = f"{manifest.parent.name} is not installed on this daemon's root (any more)"
        return {"package": None, "package_problem": problem}
    try:
        return {"package": load_manifest(manifest).to_dict(), "package_problem": None}
    except (ManifestError, OSError) as exc:
        return {"package": None, "package_problem": str(exc)}
