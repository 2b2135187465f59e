"""Checking a demo turn against its expectation, and the table of outcomes."""

from __future__ import annotations

from supervisor.demo.batch import Expectation
from supervisor.demo.results import DemoResult, check_result, format_results


def test_unexpected_outcome_is_flagged() -> None:
    """A turn that ends differently from the expectation is marked and shown as such."""
    turn = {
        "turn_id": 1,
        "kind": "instruction",
        "state": "failed",
        "attempts": [{"attempt": 1, "decision": "TERMINATE", "outcome": "FAILURE"}],
    }
    result = check_result(Expectation("x", {}, "succeeded"), turn)
    assert not result.ok
    assert "failed (expected succeeded)" in format_results([result])
    ok = check_result(Expectation("y", {}, "failed", ("TERMINATE",)), turn)
    assert ok == DemoResult("y", "failed", turn, True, "")


def test_unexpected_decisions_are_flagged() -> None:
    """The right final state with the wrong decisions on the way is not ok, and says why."""
    turn = {
        "turn_id": 2,
        "kind": "process",
        "state": "timeout",
        "attempts": [{"attempt": 1, "decision": "TERMINATE"}],
    }
    result = check_result(Expectation("z", {}, "timeout", ("RETRY", "TERMINATE")), turn)
    assert not result.ok
    assert result.note == "decisions ('TERMINATE',) != ('RETRY', 'TERMINATE')"
