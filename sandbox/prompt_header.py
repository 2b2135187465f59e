"""Prompt headers: the declared context of a turn, as data and as text (FR-RT-005)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["DeclaredInput", "PromptHeader", "build_prompt_header", "hash_file"]


@dataclass(frozen=True, slots=True)
class DeclaredInput:
    """One declared input: its path and the sha256 of its content (``missing`` if absent)."""

    path: str
    sha256: str


@dataclass(frozen=True, slots=True)
class PromptHeader:
    """The header an agent sees before a turn."""

    session_id: str
    turn_number: int
    declared_inputs: tuple[DeclaredInput, ...]
    declared_outputs: tuple[tuple[str, str], ...]
    context_as_of: str
    work_order_id: str | None = None

    def to_dict(self) -> dict[str, object]:
        """The header as plain data."""
        data: dict[str, object] = {
            "session_id": self.session_id,
            "turn_number": self.turn_number,
            "declared_inputs": [{"path": i.path, "sha256": i.sha256} for i in self.declared_inputs],
            "declared_outputs": [{"path": p, "role": r} for p, r in self.declared_outputs],
            "context_as_of": self.context_as_of,
        }
        if self.work_order_id is not None:
            data["work_order_id"] = self.work_order_id
        return data

    def render(self) -> str:
        """The header as text."""
        lines = [
            f"session_id: {self.session_id}",
            f"turn_number: {self.turn_number}",
        ]
        if self.work_order_id is not None:
            lines.append(f"work_order_id: {self.work_order_id}")
        lines.append(f"context_as_of: {self.context_as_of}")
        lines.append("declared_inputs:")
        lines.extend(f"  - {i.path} sha256={i.sha256}" for i in self.declared_inputs)
        lines.append("declared_outputs:")
        lines.extend(f"  - {p} ({r})" for p, r in self.declared_outputs)
        return "\n".join(lines) + "\n"


def hash_file(path: Path) -> str:
    """sha256 hex of a file's content, ``"missing"`` when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return "missing"
    return digest.hexdigest()


def build_prompt_header(
    *,
    session_id: str,
    turn_number: int,
    declared_inputs: Iterable[str] = (),
    declared_outputs: Sequence[Mapping[str, str]] = (),
    base: Path,
    work_order_id: str | None = None,
    now: datetime | None = None,
) -> PromptHeader:
    """Hash each declared input (relative paths against *base*) and assemble the header."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    inputs = tuple(DeclaredInput(p, hash_file(base / p)) for p in declared_inputs)
    outputs = tuple((str(o["path"]), str(o.get("role", ""))) for o in declared_outputs)
    return PromptHeader(
        session_id=session_id,
        turn_number=turn_number,
        declared_inputs=inputs,
        declared_outputs=outputs,
        context_as_of=moment.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        work_order_id=work_order_id,
    )
