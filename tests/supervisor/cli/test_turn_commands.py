"""`hunter submit` flags to a `turn.submit` request, and its usage errors."""

from __future__ import annotations

import pytest

from supervisor.cli import build_parser, main
from supervisor.cli.turn_commands import submit_params


def test_submit_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to submit, or both kinds at once, is a usage error (exit 2)."""
    assert main(["submit", "--session", "S"]) == 2
    assert "nothing to submit" in capsys.readouterr().err
    assert main(["submit", "--session", "S", "--command", "READ", "--", "true"]) == 2
    assert "not both" in capsys.readouterr().err


def test_submit_params_for_instruction() -> None:
    """Instruction flags become a turn.submit request with typed parameters."""
    args = build_parser().parse_args(
        ["submit", "--session", "S", "--command", "extract", "--selector", "li",
         "--param", "max_items=5", "--param", "all=true", "--phase", "green",
         "--idempotency-key", "k"]
    )  # fmt: skip
    assert submit_params(args) == {
        "session_id": "S",
        "declared_outputs": [],
        "declared_inputs": [],
        "phase": "GREEN",
        "idempotency_key": "k",
        "kind": "instruction",
        "command_type": "EXTRACT",
        "target_url": "",
        "target_selector": "li",
        "parameters": {"max_items": 5, "all": True},
    }
