"""Tests of ledger.verify: every kind of tampering is detected, nothing is repaired."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import structlog

from ledger import (
    Head,
    InlineSyncer,
    IntegrityError,
    SessionLedgers,
    open_ledger,
    verify,
    verify_root,
    verify_session_dir,
)
from ledger.chain import genesis_hash, seal
from ledger.heads import HeadAnchor, SidecarHeadStore

WriteLedger = Callable[..., None]
TurnRecord = Callable[..., dict[str, object]]


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_intact_ledger_report(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """An intact ledger verifies; the report carries count, head and the anchor."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 5)
    report = verify(path)
    assert (report.entries, report.legacy_entries, report.head_seq) == (5, 0, 5)
    assert report.ledger_id == "SES-test/exec"
    assert report.anchored_seq == 5
    assert report.head_path == tmp_path / "l.jsonl.head"
    assert report.warnings == ()


def test_every_single_byte_flip_is_detected(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """Flipping any one byte (one bit, or all bits) of a small ledger fails verification."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 4)
    original = path.read_bytes()
    copy = tmp_path / "copy.jsonl"
    head = tmp_path / "l.jsonl.head"
    for mask in (0x01, 0xFF):
        for index in range(len(original)):
            tampered = bytearray(original)
            tampered[index] ^= mask
            copy.write_bytes(bytes(tampered))
            with pytest.raises(IntegrityError):
                verify(copy, ledger_id="SES-test/exec", head_store=head)
    assert path.read_bytes() == original  # verify never writes


def test_drop_last_line_detected_by_anchor(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """A valid prefix is a valid chain: only the anchored head reveals the truncation."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 5)
    path.write_bytes(b"".join(_lines(path)[:-1]))
    with pytest.raises(
        IntegrityError,
        match=r":4: seq 4: truncated below anchored head \(anchored seq 5, file ends at seq 4\)$",
    ):
        verify(path)


def test_rewritten_tail_detected_by_anchor(
    tmp_path: Path, write_ledger: WriteLedger, turn_record: TurnRecord
) -> None:
    """Rolling back and re-appending a different entry (a valid chain) fails on the anchor."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 3)
    lines = _lines(path)
    previous = orjson.loads(lines[1])["entry_hash"]
    forged: dict[str, object] = {
        **turn_record(3, "failed"),
        "v": 1,
        "ledger_id": "SES-test/exec",
        "seq": 3,
        "previous_hash": previous,
        "ts_us": 1,
    }
    line, _digest = seal(forged)
    path.write_bytes(lines[0] + lines[1] + line)
    with pytest.raises(IntegrityError, match=r":3: seq 3: anchored head mismatch"):
        verify(path)


def test_reorder_detected(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """Swapping two lines breaks the seq order."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 4)
    lines = _lines(path)
    lines[1], lines[2] = lines[2], lines[1]
    path.write_bytes(b"".join(lines))
    with pytest.raises(IntegrityError, match=r":2: seq 3: seq gap: expected seq 2, found 3$"):
        verify(path)


def test_splice_from_other_session_detected(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """An entry copied from another session's ledger names another ledger id."""
    mine = tmp_path / "planes/t/sessions/SES-a/ledger/exec.jsonl"
    theirs = tmp_path / "planes/t/sessions/SES-b/ledger/exec.jsonl"
    write_ledger(mine, 3, ledger_id="SES-a/exec")
    write_ledger(theirs, 3, ledger_id="SES-b/exec")
    lines = _lines(mine)
    lines[1] = _lines(theirs)[1]
    mine.write_bytes(b"".join(lines))
    with pytest.raises(IntegrityError, match=r":2: seq 2: wrong ledger id: expected 'SES-a/exec'"):
        verify(mine)


def test_whole_file_from_other_session_detected(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """A whole ledger copied over another session's is caught by the id implied by its path."""
    mine = tmp_path / "planes/t/sessions/SES-a/ledger/exec.jsonl"
    theirs = tmp_path / "planes/t/sessions/SES-b/ledger/exec.jsonl"
    write_ledger(theirs, 2, ledger_id="SES-b/exec")
    mine.parent.mkdir(parents=True)
    mine.write_bytes(theirs.read_bytes())
    with pytest.raises(IntegrityError, match=r":1: seq 1: wrong ledger id"):
        verify(mine)


def test_renumber_detected(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """Changing a seq (and keeping the line canonical) breaks the entry's hash."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 3)
    lines = _lines(path)
    entry = orjson.loads(lines[2])
    entry["seq"] = 7
    lines[2] = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS) + b"\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(IntegrityError, match=r":3: seq 7: bad hash"):
        verify(path)


def test_resealed_renumbering_detected(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """Renumbering with freshly computed hashes still fails (seq gap / links)."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 3)
    lines = _lines(path)
    entry = orjson.loads(lines[2])
    del entry["entry_hash"]
    entry["seq"] = 4
    line, _digest = seal(entry)
    path.write_bytes(lines[0] + lines[1] + line)
    with pytest.raises(IntegrityError, match=r":3: seq 4: seq gap: expected seq 3, found 4$"):
        verify(path)


def test_non_canonical_bytes_detected(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """The same logical entry with other bytes (spaces, key order) is refused."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 2)
    lines = _lines(path)
    lines[1] = lines[1].replace(b'","', b'", "', 1)
    path.write_bytes(b"".join(lines))
    with pytest.raises(IntegrityError, match=r":2: seq 2: non-canonical bytes$"):
        verify(path)


def test_float_in_line_detected(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """A hand-written float changes the bytes and the hash: refused."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 2)
    lines = _lines(path)
    lines[1] = lines[1].replace(b'"turn_number":2', b'"turn_number":2.0')
    path.write_bytes(b"".join(lines))
    with pytest.raises(IntegrityError, match=r":2: seq 2: bad hash"):
        verify(path)


def test_torn_last_line_is_an_error_for_verify(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """verify reports a torn tail and leaves the file alone (the writer recovers it)."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 2)
    data = path.read_bytes() + b'{"partial'
    path.write_bytes(data)
    with pytest.raises(IntegrityError, match=r":3: seq \?: torn last line \(9 bytes"):
        verify(path)
    assert path.read_bytes() == data


def test_undecodable_line(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """Garbage in the middle is an IntegrityError naming the line."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 3)
    lines = _lines(path)
    lines[1] = b"not json\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(IntegrityError, match=r":2: seq \?: undecodable line"):
        verify(path)


def test_legacy_prefix_warns_and_counts(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """Hash-less leading entries are counted and logged as a warning; hashed ones follow."""
    path = tmp_path / "l.jsonl"
    path.write_bytes(b'{"kind":"old","turn_number":1}\n{"kind":"old","turn_number":2}\n')
    with open_ledger(path, ledger_id="L", syncer=quick_syncer) as writer:
        assert writer.legacy_entries == 2
        assert writer.head == (0, genesis_hash("L", path.read_bytes()))
        writer.append({"kind": "new"})
    with structlog.testing.capture_logs() as logs:
        report = verify(path)
    assert (report.entries, report.legacy_entries) == (1, 2)
    assert report.warnings == ("legacy prefix: 2 entries without hashes",)
    assert {"event": "ledger_legacy_prefix", "log_level": "warning"}.items() <= logs[0].items()


def test_legacy_prefix_is_bound_by_the_chain(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """Editing a legacy line after a hashed entry follows it breaks the first link."""
    path = tmp_path / "l.jsonl"
    path.write_bytes(b'{"kind":"old","n":1}\n')
    with open_ledger(path, ledger_id="L", syncer=quick_syncer) as writer:
        writer.append({"kind": "new"})
    path.write_bytes(path.read_bytes().replace(b'"n":1', b'"n":2'))
    with pytest.raises(IntegrityError, match=r":2: seq 1: broken link"):
        verify(path)


def test_legacy_entry_after_hashed_fails(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """A hash-less entry after a hashed one is tampering, not legacy."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 2)
    path.write_bytes(path.read_bytes() + b'{"kind":"old"}\n')
    with pytest.raises(IntegrityError, match=r":3: seq \?: hash-less entry after a hashed one$"):
        verify(path)


def test_missing_anchor_is_a_warning(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """Without a head file verification passes but says truncation cannot be detected."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 2)
    (tmp_path / "l.jsonl.head").unlink()
    report = verify(path)
    assert report.anchored_seq is None
    assert "truncation cannot be detected" in report.warnings[0]


def test_corrupt_anchor_is_an_error(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """A head file with no valid slot fails verification."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 2)
    (tmp_path / "l.jsonl.head").write_bytes(b"x" * 256)
    with pytest.raises(IntegrityError, match=r"head anchor file has no valid slot$"):
        verify(path)


def test_explicit_head_store(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """A HeadStore or a head file path overrides the location rule."""
    path = tmp_path / "l.jsonl"
    other = tmp_path / "elsewhere.head"
    with open_ledger(path, ledger_id="L", head_store=other, syncer=quick_syncer) as writer:
        writer.append({"kind": "k"})
    assert not (tmp_path / "l.jsonl.head").exists()
    assert verify(path, head_store=other).anchored_seq == 1
    assert verify(path, head_store=SidecarHeadStore()).anchored_seq is None


def test_verify_session_dir_requires_both(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """FR-RT-018: a session with one ledger missing fails the gate."""
    with SessionLedgers.create(
        root=tmp_path, tier="t", session_id="SES-1", syncer=quick_syncer
    ) as ledgers:
        ledgers.record_turn(turn_number=1, query_hash="q", result_hash="r", status="succeeded")
    reports = verify_session_dir(ledgers.session_dir)
    assert [report.entries for report in reports] == [2, 2]
    ledgers.evidence_path.unlink()
    with pytest.raises(IntegrityError, match=r"evidence\.jsonl:0: seq \?: ledger missing"):
        verify_session_dir(ledgers.session_dir)


def test_verify_root_serial_and_parallel(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """verify_root checks every session; parallel and serial agree; failures are collected."""
    for index in range(4):
        with SessionLedgers.create(
            root=tmp_path, tier="t", session_id=f"SES-{index}", syncer=quick_syncer
        ) as ledgers:
            ledgers.record_turn(turn_number=1, query_hash="q", result_hash="r", status="ok")
    bad = tmp_path / "planes/t/sessions/SES-2/ledger/exec.jsonl"
    bad.write_bytes(bad.read_bytes().replace(b'"status":"ok"', b'"status":"no"'))
    progress: list[tuple[int, int]] = []
    serial = verify_root(
        tmp_path, workers=1, progress=lambda done, total: progress.append((done, total))
    )
    parallel = verify_root(tmp_path, workers=2)
    for batch in (serial, parallel):
        assert not batch.ok
        assert len(batch.reports) == 6
        assert [error.path for error in batch.errors] == [bad]
        assert batch.errors[0].reason.startswith("bad hash")
    assert progress[-1] == (4, 4)


def test_anchor_seq_zero_mismatch(
    tmp_path: Path, quick_syncer: InlineSyncer, write_ledger: WriteLedger
) -> None:
    """An anchor at seq 0 must be the genesis of that ledger id."""
    path = tmp_path / "l.jsonl"
    write_ledger(path, 1)
    anchor = HeadAnchor(tmp_path / "zero.head")
    anchor.write(Head(0, "0" * 64))
    anchor.close()
    with pytest.raises(IntegrityError, match=r"anchored head mismatch at seq 0"):
        verify(path, head_store=tmp_path / "zero.head")
