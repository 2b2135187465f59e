"""`hunter submit` flags to the turn the client library submits, and its usage errors."""

from __future__ import annotations

import pytest

from supervisor.cli import build_parser, main
from supervisor.cli.turn_commands import Submission, submit_params


def test_submit_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to submit, or both kinds at once, is a usage error (exit 2)."""
    assert main(["submit", "--session", "S"]) == 2
    assert "nothing to submit" in capsys.readouterr().err
    assert main(["submit", "--session", "S", "--command", "READ", "--", "true"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["submit", "--session", "S", "--command", "READ", "--declare-output", "x"]) == 2
    assert "--declare-output is for process turns" in capsys.readouterr().err


def test_submit_params_for_instruction() -> None:
    """Instruction flags become an instruction submission with typed parameters."""
    args = build_parser().parse_args(
        ["submit", "--session", "S", "--command", "extract", "--selector", "li",
         "--param", "max_items=5", "--param", "all=true", "--phase", "green",
         "--idempotency-key", "k"]
    )  # fmt: skip
    assert submit_params(args) == Submission(
        session_id="S",
        phase="GREEN",
        idempotency_key="k",
        command_type="EXTRACT",
        url="",
        selector="li",
        parameters={"max_items": 5, "all": True},
    )


def test_submit_params_for_process() -> None:
    """A process turn's argv, declarations and options; ``--compact`` asks for the compact
    answer."""
    args = build_parser().parse_args(
        ["submit", "--session", "S", "--declare-output", "out.txt:report",
         "--declare-input", "in.txt", "--timeout-ms", "500", "--compact", "--", "sh", "-c", "x"]
    )  # fmt: skip
    assert submit_params(args) == Submission(
        session_id="S",
        argv=("sh", "-c", "x"),
        declared_outputs=({"path": "out.txt", "role": "report"},),
        declared_inputs=("in.txt",),
        timeout_ms=500,
        compact=True,
    )
