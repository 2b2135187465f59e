"""The demo's results: each turn checked against its expectation, and the table of outcomes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.cli.output import table
from supervisor.demo.batch import Expectation

__all__ = ["DemoResult", "check_result", "format_results"]


@dataclass
class DemoResult:
    """One demo turn as it ended: `ok` when it matched its expectation (`note` says what not)."""

    label: str
    expected: str
    turn: dict[str, Any]
    ok: bool
    note: str = ""


def check_result(exp: Expectation, turn: dict[str, Any]) -> DemoResult:
    """The result of a finished (or parked) turn: its state, and decisions if they are given."""
    decisions = tuple(a.get("decision") or "-" for a in turn["attempts"])
    ok = turn["state"] == exp.expect
    note = ""
    if exp.expect_decisions is not None and decisions != exp.expect_decisions:
        ok = False
        note = f"decisions {decisions} != {exp.expect_decisions}"
    return DemoResult(exp.label, exp.expect, turn, ok, note)


def _result_text(r: DemoResult) -> str:
    if not r.ok:
        return f"{r.turn['state']} (expected {r.expected})"
    return r.expected if "->" in r.expected else str(r.turn["state"])


def format_results(results: Sequence[DemoResult]) -> str:
    """The table `hunter demo` prints: one row per attempt, the result on each turn's first."""
    rows: list[tuple[object, ...]] = []
    for r in results:
        t = r.turn
        attempts = t["attempts"] or [{}]
        for i, a in enumerate(attempts):
            first = i == 0
            rows.append(
                (
                    t["turn_id"] if first else "",
                    r.label if first else "",
                    a.get("attempt", "-"),
                    a.get("executor_id") or ("sandbox" if t["kind"] == "process" else "-"),
                    a.get("fault_type") or (a.get("outcome") or "-"),
                    a.get("decision") or "-",
                    a.get("reason_code") or "-",
                    _result_text(r) if first else "",
                )
            )
    return table(
        ("TURN", "WHAT", "ATT", "EXECUTOR", "FAULT/OUTCOME", "DECISION", "REASON", "RESULT"),
        rows,
    )
