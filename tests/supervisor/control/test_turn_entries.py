"""`turn.get`'s ledger entries read from the end of the session's files: every entry of the
turn, in seq order, wherever it lies (across read blocks, far apart), never another turn's
(turn 1 against 10 and 100), a line being appended skipped, and the search bounded by the
turn's acceptance."""

from __future__ import annotations

from pathlib import Path

import orjson

from supervisor.control.turn_entries import CLOCK_MARGIN_US, turn_ledger_entries

_BASE_US = 1_800_000_000_000_000


def _write(session_dir: Path, entries: list[dict[str, object]], tail: bytes = b"") -> None:
    ledger = session_dir / "ledger"
    ledger.mkdir(parents=True, exist_ok=True)
    for name in ("exec", "evidence"):
        lines = b"".join(orjson.dumps({**e, "pad": "p" * 500}) + b"\n" for e in entries)
        (ledger / f"{name}.jsonl").write_bytes(lines + tail)


def _entry(
    seq: int, turn_number: int, kind: str = "turn", ts_us: int | None = None
) -> dict[str, object]:
    return {
        "v": 1,
        "seq": seq,
        "kind": kind,
        "turn_number": turn_number,
        "ts_us": _BASE_US + seq * 1000 if ts_us is None else ts_us,
        "entry_hash": f"{seq:064x}",
        "previous_hash": f"{seq - 1:064x}",
    }


def test_every_entry_of_the_turn_in_seq_order_across_blocks(tmp_path: Path) -> None:
    """Turn 1 escalated early and ended 2,000 entries later (megabytes apart, many read
    blocks); turns 10 and 100 and 1000 are not mistaken for it; a half-written last line is
    skipped."""
    entries = [_entry(1, 1, "escalation")]
    entries += [_entry(seq, 10 + seq) for seq in range(2, 2001)]
    entries += [_entry(2001, 1)]
    _write(tmp_path, entries, tail=b'{"v":1,"seq":2002,"kind":"turn","turn_number":1,"ts')
    got = turn_ledger_entries(tmp_path, 1, accepted_us=_BASE_US)
    for name in ("exec", "evidence"):
        assert [(e["seq"], e["kind"]) for e in got[name]] == [(1, "escalation"), (2001, "turn")]
        assert set(got[name][0]) == {"seq", "kind", "ts_us", "entry_hash", "previous_hash"}
    assert [e["seq"] for e in turn_ledger_entries(tmp_path, 10)["exec"]] == []
    assert [e["seq"] for e in turn_ledger_entries(tmp_path, 100)["exec"]] == [90]
    assert [e["seq"] for e in turn_ledger_entries(tmp_path, 1000)["evidence"]] == [990]


def test_the_search_stops_before_the_turn_was_accepted(tmp_path: Path) -> None:
    """An entry sealed more than the clock margin before the turn's acceptance is never read
    for it (an entry that claims its number there is another chain's stray line); without the
    acceptance the whole file is read."""
    accepted = _BASE_US + 100 * CLOCK_MARGIN_US
    stray = _entry(1, 7, ts_us=_BASE_US)
    filler = [_entry(seq, 1000 + seq, ts_us=_BASE_US + seq) for seq in range(2, 400)]
    late = [_entry(seq, 1000 + seq, ts_us=accepted + seq) for seq in range(400, 600)]
    mine = _entry(600, 7, ts_us=accepted + 600)
    _write(tmp_path, [stray, *filler, *late, mine])
    bounded = turn_ledger_entries(tmp_path, 7, accepted_us=accepted)
    assert [e["seq"] for e in bounded["exec"]] == [600]
    whole = turn_ledger_entries(tmp_path, 7)
    assert [e["seq"] for e in whole["exec"]] == [1, 600]


def test_missing_files_give_no_entries(tmp_path: Path) -> None:
    assert turn_ledger_entries(tmp_path, 1, accepted_us=_BASE_US) == {"exec": [], "evidence": []}
