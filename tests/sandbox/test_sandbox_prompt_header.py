"""Prompt headers (FR-RT-005)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

from sandbox.prompt_header import build_prompt_header


def test_header_holds_declared_context(tmp_path: Path) -> None:
    """Inputs are hashed; outputs, ids and context_as_of are present, as data and text."""
    (tmp_path / "in.txt").write_bytes(b"data")
    header = build_prompt_header(
        session_id="SES-x",
        turn_number=3,
        declared_inputs=["in.txt", "gone.txt"],
        declared_outputs=[{"path": "out.json", "role": "result"}],
        base=tmp_path,
        work_order_id="WO-7",
        now=datetime(2026, 5, 6, 7, 8, 9, 10, tzinfo=UTC),
    )
    data = header.to_dict()
    assert data == {
        "session_id": "SES-x",
        "turn_number": 3,
        "declared_inputs": [
            {"path": "in.txt", "sha256": hashlib.sha256(b"data").hexdigest()},
            {"path": "gone.txt", "sha256": "missing"},
        ],
        "declared_outputs": [{"path": "out.json", "role": "result"}],
        "context_as_of": "2026-05-06T07:08:09.000010Z",
        "work_order_id": "WO-7",
    }
    text = header.render()
    assert "session_id: SES-x\nturn_number: 3\nwork_order_id: WO-7\n" in text
    assert "  - out.json (result)" in text


def test_work_order_id_absent_when_not_given(tmp_path: Path) -> None:
    """Without a work order the key is left out."""
    header = build_prompt_header(session_id="S", turn_number=1, base=tmp_path)
    assert "work_order_id" not in header.to_dict()
    assert "work_order_id" not in header.render()
