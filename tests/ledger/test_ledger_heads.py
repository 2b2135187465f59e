"""Tests of ledger.heads: the location rule and the two-slot head file."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import Head, IntegrityError, SidecarHeadStore, StateDirHeadStore, read_head
from ledger.heads import SLOT_SIZE, HeadAnchor, default_head_store, resolve_head_path


def test_location_rule_under_planes(tmp_path: Path) -> None:
    """A ledger under <root>/planes/... anchors under <root>/state/ledger-heads/."""
    ledger = tmp_path / "planes/t/sessions/S/ledger/exec.jsonl"
    store = default_head_store(ledger)
    assert store == StateDirHeadStore(tmp_path)
    assert store.head_path(ledger) == (
        tmp_path / "state/ledger-heads/planes/t/sessions/S/ledger/exec.jsonl.head"
    )


def test_location_rule_elsewhere_is_sidecar(tmp_path: Path) -> None:
    """Any other ledger gets <file>.head."""
    ledger = tmp_path / "x/my.jsonl"
    assert default_head_store(ledger) == SidecarHeadStore()
    assert resolve_head_path(ledger, None) == tmp_path / "x/my.jsonl.head"
    assert resolve_head_path(ledger, tmp_path / "h") == tmp_path / "h"


def test_slots_alternate_and_latest_wins(tmp_path: Path) -> None:
    """Writes alternate between the two slots; the higher seq is the head."""
    path = tmp_path / "d/l.head"
    anchor = HeadAnchor(path)
    assert read_head(path) is None  # created, nothing anchored
    for seq in range(1, 4):
        anchor.write(Head(seq, f"{seq:x}" * 64))
    anchor.close()
    assert read_head(path) == Head(3, "3" * 64)
    assert len(path.read_bytes()) == 2 * SLOT_SIZE
    reopened = HeadAnchor(path)
    reopened.write(Head(4, "4" * 64))  # overwrites the older slot (seq 2)
    reopened.close()
    data = path.read_bytes()
    assert b"3" * 64 in data
    assert read_head(path) == Head(4, "4" * 64)


def test_torn_slot_falls_back_to_other(tmp_path: Path) -> None:
    """A slot that fails its check is ignored; the other one is used."""
    path = tmp_path / "l.head"
    anchor = HeadAnchor(path)
    anchor.write(Head(1, "a" * 64))
    anchor.write(Head(2, "b" * 64))
    anchor.close()
    data = bytearray(path.read_bytes())
    data[SLOT_SIZE + 5] ^= 1  # damage slot 2 (seq 2)
    path.write_bytes(bytes(data))
    assert read_head(path) == Head(1, "a" * 64)


def test_no_valid_slot_is_integrity_error(tmp_path: Path) -> None:
    """A head file with garbage in both slots fails."""
    path = tmp_path / "l.head"
    path.write_bytes(b"z" * (2 * SLOT_SIZE))
    with pytest.raises(IntegrityError, match=r"l\.head:0: seq \?: head anchor file has no valid"):
        read_head(path)
