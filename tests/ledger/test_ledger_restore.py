"""Lines a store kept for the ledger (`seal_prepared`, `flush`, `restore`).

The daemon's turn store commits a turn's sealed lines with its ending; the file gets them from
the writer and is synced later. After a power loss the file may lack lines the store kept:
`restore` writes them back, each checked to continue the chain, and refuses anything else.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ledger import IntegrityError, SealedLine, open_ledger, verify
from ledger.syncer import InlineSyncer

LEDGER = "S1/exec"


def _record(n: int) -> dict[str, object]:
    return {"kind": "note", "n": n}


def _sealed(tmp_path: Path, count: int) -> tuple[Path, list[SealedLine]]:
    """A ledger with *count* entries; the lines as sealed."""
    path = tmp_path / "full" / "exec.jsonl"
    lines = []
    with open_ledger(path, ledger_id=LEDGER, syncer=InlineSyncer()) as writer:
        for n in range(count):
            entry, line = writer.seal_prepared(writer.prepare(_record(n)))
            assert (line.seq, line.entry_hash, line.ledger_id) == (
                entry.seq,
                entry.entry_hash,
                LEDGER,
            )
            lines.append(line)
    return path, lines


def _prefix(tmp_path: Path, source: Path, keep: int) -> Path:
    """A copy of the first *keep* lines of *source*, as a power loss leaves a file."""
    path = tmp_path / "lost" / "exec.jsonl"
    path.parent.mkdir(parents=True)
    data = source.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(data[:keep]))
    return path


def test_sealed_lines_are_the_file_bytes(tmp_path: Path) -> None:
    """What `seal_prepared` returns is exactly what lands in the file."""
    path, lines = _sealed(tmp_path, 3)
    assert path.read_bytes() == b"".join(x.line for x in lines)


def test_flush_writes_without_waiting(tmp_path: Path) -> None:
    """`flush` puts queued lines in the file; durability stays where it was."""
    path = tmp_path / "exec.jsonl"
    with open_ledger(path, ledger_id=LEDGER, syncer=InlineSyncer()) as writer:
        writer.seal_prepared(writer.prepare(_record(1)))
        assert path.read_bytes() == b""
        writer.flush()
        assert path.read_bytes().count(b"\n") == 1
        assert writer.durable_seq == 0


def test_restore_writes_back_lost_lines(tmp_path: Path) -> None:
    """The file lost its last two lines; restoring all kept lines appends just those two
    (durably), and the chain verifies and continues."""
    full, lines = _sealed(tmp_path, 5)
    lost = _prefix(tmp_path, full, 3)
    with open_ledger(lost, ledger_id=LEDGER, syncer=InlineSyncer()) as writer:
        assert writer.restore(lines) == 2
        assert writer.durable_seq == 5
        assert writer.restore(lines) == 0  # already there: nothing to do
        writer.append(_record(99))
    assert lost.read_bytes().startswith(full.read_bytes())
    assert verify(lost, ledger_id=LEDGER).entries == 6


def _edit(line: SealedLine, old: bytes, new: bytes) -> SealedLine:
    return replace(line, line=line.line.replace(old, new))


@pytest.mark.parametrize(
    ("name", "change", "reason"),
    [
        ("gap", lambda xs: xs[4:], "a gap"),
        ("other ledger", lambda xs: [replace(x, ledger_id="S2/exec") for x in xs], "belongs to"),
        ("tampered", lambda xs: [_edit(x, b'"n":3', b'"n":7') for x in xs[3:]], "not the sealed"),
        (
            "wrong hash",
            lambda xs: [replace(x, entry_hash="0" * 64) for x in xs[3:]],
            "not the sealed",
        ),
    ],
)
def test_restore_refuses_lines_that_do_not_continue_the_chain(
    tmp_path: Path, name: str, change: object, reason: str
) -> None:
    """A line that does not continue the file's chain is tampering, not a crash: refused,
    and the file is left as it was."""
    full, lines = _sealed(tmp_path, 5)
    lost = _prefix(tmp_path, full, 3)
    before = lost.read_bytes()
    assert callable(change)
    with (
        open_ledger(lost, ledger_id=LEDGER, syncer=InlineSyncer()) as writer,
        pytest.raises(IntegrityError, match=reason),
    ):
        writer.restore(change(lines))
    assert lost.read_bytes() == before, name


def test_restore_refuses_a_forked_chain(tmp_path: Path) -> None:
    """Lines sealed on another branch of the chain: a next line whose previous hash is not the
    file's head, or a different line under the head's own seq."""
    full, _ = _sealed(tmp_path, 3)
    fork = _prefix(tmp_path, full, 2)
    with open_ledger(fork, ledger_id=LEDGER, syncer=InlineSyncer()) as writer:
        third = writer.seal_prepared(writer.prepare({"kind": "note", "n": "fork"}))[1]
        fourth = writer.seal_prepared(writer.prepare({"kind": "note", "n": "fork-4"}))[1]
    with open_ledger(full, ledger_id=LEDGER, syncer=InlineSyncer()) as writer:
        with pytest.raises(IntegrityError, match="does not link"):
            writer.restore([fourth])
        with pytest.raises(IntegrityError, match="holds another line at seq 3"):
            writer.restore([third])
