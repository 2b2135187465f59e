"""`hunter turn show`: the full decision record of a turn, readable and `--json`, from a real
`hunter serve` process, real executor processes and the session's real ledger files."""

from __future__ import annotations

import functools
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from ledger import session_dir_for
from supervisor.cli import main
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root other users can traverse (process turns run under their own uid)."""
    path = Path(tempfile.mkdtemp(prefix="hh-show-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def stack(root: Path) -> AsyncIterator[DemoStack]:
    """A running `hunter serve` on a fresh root with the demo (fast) config."""
    s = DemoStack(root=root, config_path=prepare_root(root, fresh=True, config_text=DEMO_CONFIG))
    try:
        await s.start_daemon()
        yield s
    finally:
        await s.aclose()


async def show(stack: DemoStack, turn_id: int, *flags: str) -> int:
    """`hunter turn show TURN_ID --socket ...` in a worker thread; its exit code."""
    argv = ["turn", "show", str(turn_id), "--socket", str(stack.control_socket), *flags]
    return await anyio.to_thread.run_sync(functools.partial(main, argv))


async def run(client: ControlClient, sid: str, **params: Any) -> dict[str, Any]:
    params.setdefault("declared_outputs", [])
    submitted = await client.call("turn.submit", session_id=sid, **params)
    done = await client.call("turn.wait", turn_id=submitted["turn"]["turn_id"], timeout_s=30)
    return dict(done["turn"])


def ledger_lines(root: Path, sid: str, name: str, turn_number: int) -> list[dict[str, Any]]:
    """The session's ledger entries of *turn_number*, read from the file by the test itself."""
    path = session_dir_for(root, "default", sid) / "ledger" / f"{name}.jsonl"
    entries = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return [e for e in entries if e.get("turn_number") == turn_number]


async def test_process_turn_record(stack: DemoStack, capsys: pytest.CaptureFixture[str]) -> None:
    """A process turn that writes an undeclared file: the record shows the state and reason,
    the attempt, declared vs realized outputs, the violation, the stdout/stderr tails and the
    hashes of exactly the turn's exec and evidence entries."""
    script = (
        'seq 1 25; echo warning >&2; echo r > "$HUNTER_OUTPUT_DIR/report.txt";'
        ' echo x > "$HUNTER_OUTPUT_DIR/extra.txt"'
    )
    async with ControlClient(stack.control_socket) as client:
        sid = (await client.call("session.open", package_id="demo"))["session_id"]
        turn = await run(
            client,
            sid,
            kind="process",
            argv=["sh", "-c", script],
            declared_outputs=[{"path": "report.txt", "role": "report"}],
        )
    assert turn["state"] == "violation"
    capsys.readouterr()
    code = await show(stack, turn["turn_id"])
    shown = capsys.readouterr().out
    assert code == 0
    assert "state:   violation  (TERMINATE SECURITY_VIOLATION_TERMINATE)" in shown
    assert "fault:   SECURITY_VIOLATION" in shown
    assert "  declared  report.txt (report)" in shown
    assert "  realized  extra.txt  2 bytes  sha256 " in shown
    assert "  write extra.txt: undeclared write (capability declared_outputs)" in shown
    assert "stdout (the last 20 of 25 lines; --json has all)" in shown
    assert "  | 25" in shown
    assert "  | 5\n" not in shown
    assert "stderr\n  | warning" in shown
    exec_entries = ledger_lines(stack.root, sid, "exec", turn["turn_number"])
    evidence_entries = ledger_lines(stack.root, sid, "evidence", turn["turn_number"])
    assert [e["kind"] for e in evidence_entries] == ["capability_violation", "turn"]
    for entry in (*exec_entries, *evidence_entries):
        assert f"entry_hash     {entry['entry_hash']}" in shown
    assert f"result_hash    {exec_entries[0]['result_hash']}" in shown
    assert await show(stack, turn["turn_id"], "--json") == 0
    record = orjson.loads(capsys.readouterr().out)
    assert record["state"] == "violation"
    assert record["result"]["stdout"].splitlines() == [str(i) for i in range(1, 26)]
    assert [e["entry_hash"] for e in record["ledger"]["exec"]] == [
        e["entry_hash"] for e in exec_entries
    ]
    assert [e["entry_hash"] for e in record["ledger"]["evidence"]] == [
        e["entry_hash"] for e in evidence_entries
    ]


async def test_retried_instruction_record(
    stack: DemoStack, capsys: pytest.CaptureFixture[str]
) -> None:
    """An instruction that crashed once and then succeeded: both attempts with their executor,
    start and end, fault, decision and the backoff before the retry; the executor's answer."""
    await stack.start_executor(
        "flaky",
        [
            "supervisor.examples.chaos_executor",
            "--commands",
            "READ",
            "--behaviour",
            "error,ok",
            "--no-reconnect",
        ],
    )
    async with ControlClient(stack.control_socket) as client:
        sid = (await client.call("session.open", package_id="demo"))["session_id"]
        turn = await run(client, sid, kind="instruction", command_type="READ", target_selector="h1")
    assert turn["state"] == "succeeded"
    delay = turn["attempts"][0]["delay_ms"]
    capsys.readouterr()
    code = await show(stack, turn["turn_id"])
    shown = capsys.readouterr().out
    assert code == 0
    rows = [line.split() for line in shown.splitlines() if line.startswith(("1 ", "2 "))]
    first, second = rows
    assert first[:2] == ["1", "flaky"]
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", first[2])
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", first[3])
    assert [first[4], second[4]] == [str(a["queued_ms"]) for a in turn["attempts"]]  # QUEUED_MS
    assert first[7] == "CRASH"
    assert first[9:] == ["RETRY", "RETRY_AFTER_CRASH", str(delay), "ms"]
    assert second[:2] == ["2", "flaky"]
    assert second[9:] == ["SUCCEED", "ATTEMPT_SUCCEEDED", "-"]
    assert "executor answer" in shown
    assert f"response_type      {turn['result']['response_type']}" in shown
    assert "ledger entries\n  exec     seq 2  turn  status succeeded" in shown
