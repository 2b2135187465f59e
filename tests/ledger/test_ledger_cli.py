"""Tests of ledger.cli: `hunter ledger verify|show` exit codes and output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ledger import InlineSyncer, SessionLedgers
from supervisor.cli import main


def _session(root: Path, session_id: str, syncer: InlineSyncer) -> SessionLedgers:
    with SessionLedgers.create(
        root=root, tier="t", session_id=session_id, syncer=syncer
    ) as ledgers:
        ledgers.record_turn(turn_number=1, query_hash="q", result_hash="r", status="succeeded")
    return ledgers


def _hunter() -> str:
    return str(Path(sys.executable).with_name("hunter"))


def test_verify_intact_file_and_session(
    tmp_path: Path, quick_syncer: InlineSyncer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 0 for an intact ledger file and session directory."""
    ledgers = _session(tmp_path, "SES-1", quick_syncer)
    assert main(["ledger", "verify", str(ledgers.exec_path), str(ledgers.session_dir)]) == 0
    out = capsys.readouterr().out
    assert f"ok {ledgers.exec_path}: 2 entries, head seq 2, anchored 2" in out
    assert out.endswith("3 ledgers intact, 0 targets failed\n")


def test_verify_reports_file_line_and_reason(
    tmp_path: Path, quick_syncer: InlineSyncer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 1 on tampering, printing <file>:<line>: seq <n>: <reason>."""
    ledgers = _session(tmp_path, "SES-1", quick_syncer)
    path = ledgers.evidence_path
    path.write_bytes(path.read_bytes().replace(b'"turn_number":1', b'"turn_number":2'))
    assert main(["ledger", "verify", "--root", str(tmp_path), "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert f"{path}:2: seq 2: bad hash: entry_hash does not match the entry\n" in out
    assert "1 target failed" in out


def test_verify_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 for a missing path, no arguments, a bad worker count or a stray directory."""
    assert main(["ledger", "verify", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["ledger", "verify"]) == 2
    assert main(["ledger", "verify", "--root", str(tmp_path), "--workers", "0"]) == 2
    assert main(["ledger", "verify", str(tmp_path)]) == 2
    assert "is not a ledger file, a session directory or a root" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["ledger", "frobnicate"])
    assert exited.value.code == 2


def test_show_readable_and_json(
    tmp_path: Path, quick_syncer: InlineSyncer, capsys: pytest.CaptureFixture[str]
) -> None:
    """show prints one readable line per entry; --json the raw lines."""
    ledgers = _session(tmp_path, "SES-1", quick_syncer)
    assert main(["ledger", "show", str(ledgers.exec_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2
    assert "session_opened" in out[0]
    assert "status=succeeded" in out[1]
    assert main(["ledger", "show", "--json", str(ledgers.exec_path)]) == 0
    assert capsys.readouterr().out.encode() == ledgers.exec_path.read_bytes()
    assert main(["ledger", "show", str(ledgers.session_dir)]) == 0
    assert capsys.readouterr().out.count("== ") == 2
    assert main(["ledger", "show", str(tmp_path / "missing")]) == 2


def test_show_tampered_exits_1(
    tmp_path: Path, quick_syncer: InlineSyncer, capsys: pytest.CaptureFixture[str]
) -> None:
    """show still prints, but exits 1 and names the problem."""
    ledgers = _session(tmp_path, "SES-1", quick_syncer)
    data = ledgers.exec_path.read_bytes()
    ledgers.exec_path.write_bytes(data.replace(b"succeeded", b"succeedeD"))
    assert main(["ledger", "show", str(ledgers.exec_path)]) == 1
    assert ":2: seq 2: bad hash" in capsys.readouterr().err


@pytest.mark.slow  # `hunter` as processes on one root: seconds (not the quick tier)
def test_hunter_subprocess_parallel_root(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """The installed `hunter ledger verify --root` runs verification in worker processes."""
    for index in range(3):
        _session(tmp_path, f"SES-{index}", quick_syncer)
    result = subprocess.run(
        [_hunter(), "ledger", "verify", "--root", str(tmp_path), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "6 ledgers intact, 0 targets failed" in result.stdout
    bad = tmp_path / "planes/t/sessions/SES-1/ledger/exec.jsonl"
    bad.write_bytes(bad.read_bytes()[:-1])  # torn last line
    result = subprocess.run(
        [_hunter(), "ledger", "verify", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert f"{bad}:2: seq ?: torn last line" in result.stdout
    missing = subprocess.run(
        [_hunter(), "ledger", "verify", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert missing.returncode == 2
    assert "no such file or directory" in missing.stderr
