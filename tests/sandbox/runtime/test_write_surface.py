"""FR-RT-015/016 in real sandboxed turns: both areas are compared with the declarations,
undeclared writes block the turn (fail closed), declared scratch is recorded, never promoted."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.runtime import Runtime, Session, TurnResult
from supervisor.cli import build_parser
from supervisor.cli.turn_commands import submit_params
from tests.turn_requests import submitted

pytestmark = pytest.mark.usefixtures("sandboxed")

Installer = Callable[..., Path]
SCRATCH_TMP = {"path": "tmp/**", "role": "scratch"}


@pytest.fixture
def session(root: Path, install: Installer) -> Iterator[Session]:
    install("pkg")
    with Runtime(root) as runtime, runtime.open_session("pkg") as sess:
        yield sess


def evidence(session: Session, turn_number: int) -> list[dict[str, Any]]:
    """The turn's evidence entries (violations first, the turn entry last)."""
    path = session.ledgers.session_dir / "ledger" / "evidence.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [e for e in entries if e.get("turn_number") == turn_number]


async def sh(session: Session, script: str, declared: list[object]) -> TurnResult:
    return await session.run_process_turn(
        ["/bin/sh", "-c", script], declared_outputs=declared, timeout_ms=10_000
    )


async def test_undeclared_file_in_tmp_blocks_the_turn(session: Session) -> None:
    """A file left in tmp/<sid> without a scratch declaration is a violation: the declared
    output is not promoted and the evidence ledger names ``tmp/<path>``."""
    result = await sh(session, 'echo r > report.txt; echo s > "$TMPDIR/left"', ["report.txt"])
    assert result.status == "violation"
    assert [(v.target, v.detail) for v in result.violations] == [("tmp/left", "undeclared write")]
    assert result.promoted_outputs == ()
    assert not (session.workspace / "report.txt").exists()
    entries = evidence(session, 1)
    recorded = [e for e in entries if e["kind"] == "capability_violation"]
    assert [v["target"] for e in recorded for v in e["capability_violations"]] == ["tmp/left"]
    assert [e["kind"] for e in entries] == ["capability_violation", "turn"]


async def test_declared_tmp_scratch_is_recorded_and_never_promoted(session: Session) -> None:
    """With ``tmp/**`` scratch the turn succeeds; the output is promoted, the scratch files are
    in the evidence entry (with the pattern that allowed them) and nowhere in the workspace."""
    script = 'echo r > report.txt; mkdir -p "$TMPDIR/c"; echo s > "$TMPDIR/c/s"'
    result = await sh(session, script, ["report.txt", SCRATCH_TMP])
    assert result.status == "succeeded", result.violations
    assert [p.path for p in result.promoted_outputs] == ["report.txt"]
    assert sorted(p.name for p in session.workspace.rglob("*")) == ["report.txt"]
    turn = evidence(session, 1)[-1]
    assert [(w["area"], w["path"], w["declared_as"]) for w in turn["scratch_writes"]] == [
        ("tmp", "c/s", "tmp/**")
    ]
    assert {"path": "tmp/**", "role": "scratch"} in turn["declared_writes"]


async def test_output_scratch_pattern_allows_only_what_it_matches(session: Session) -> None:
    """``build/*.o`` scratch allows object files in output/<sid>/build and nothing else:
    a stray ``build/log.txt`` still blocks the turn."""
    declared: list[object] = ["a.out", {"path": "build/*.o", "role": "scratch"}]
    ok = await sh(session, "mkdir build; touch build/x.o build/y.o; echo b > a.out", declared)
    assert ok.status == "succeeded", ok.violations
    assert [p.path for p in ok.promoted_outputs] == ["a.out"]
    assert not (session.workspace / "build").exists()
    bad = await sh(session, "mkdir build; touch build/x.o build/log.txt; echo b > a.out", declared)
    assert bad.status == "violation"
    assert [v.target for v in bad.violations] == ["build/log.txt"]


def test_scratch_travels_from_the_cli_through_the_intake() -> None:
    """``--declare-output 'tmp/**:scratch'`` becomes a ``{"path", "role"}`` declaration the
    daemon's intake accepts as scratch."""
    args = build_parser().parse_args(
        ["submit", "--session", "S", "--declare-output", "out.txt",
         "--declare-output", "tmp/**:scratch", "--", "/bin/true"]
    )  # fmt: skip
    submission = submit_params(args)
    assert submission.declared_outputs == (
        {"path": "out.txt", "role": None},
        {"path": "tmp/**", "role": "scratch"},
    )
    # as the client library sends them (`Client.submit_process`)
    request = submitted(
        {
            "session_id": submission.session_id,
            "kind": "process",
            "argv": list(submission.argv),
            "declared_outputs": [dict(d) for d in submission.declared_outputs],
        }
    )
    assert [(d.path, d.is_scratch) for d in request.spec.declared_outputs] == [
        ("out.txt", False),
        ("tmp/**", True),
    ]
