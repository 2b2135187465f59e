"""The demo batch: each turn the demo submits, and the state (and decisions) it must end in.

Round 1 runs `web_batch` (every command type, in order: the web executor has one tab) beside
`process_batch`; round 2 `chaos_batch` against the executors of `CHAOS_ROUND`; round 3
`chaos_batch_2` against `CHAOS_ROUND_2`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CHAOS_ROUND",
    "CHAOS_ROUND_2",
    "Expectation",
    "chaos_batch",
    "chaos_batch_2",
    "process_batch",
    "web_batch",
]


@dataclass(frozen=True, slots=True)
class Expectation:
    """One demo turn: what is submitted and the state it must end in."""

    label: str
    params: Mapping[str, object]
    expect: str
    expect_decisions: tuple[str, ...] | None = None


def _instruction(command: str, **extra: object) -> dict[str, object]:
    return {"kind": "instruction", "command_type": command, "declared_outputs": [], **extra}


def _process(argv: Sequence[str], **extra: object) -> dict[str, object]:
    return {"kind": "process", "argv": list(argv), "declared_outputs": [], **extra}


def web_batch(base_url: str) -> list[Expectation]:
    """Every command type against the demo pages (run in order: the executor has one tab)."""
    return [
        Expectation(
            "web NAVIGATE", _instruction("NAVIGATE", target_url=base_url + "/"), "succeeded"
        ),
        Expectation("web READ", _instruction("READ", target_selector="#title"), "succeeded"),
        Expectation(
            "web CLICK link",
            _instruction("CLICK", target_selector="#catalogue-link"),
            "succeeded",
        ),
        Expectation(
            "web EXTRACT",
            _instruction("EXTRACT", target_selector=".name", parameters={"max_items": 100}),
            "succeeded",
        ),
        Expectation("web SCROLL", _instruction("SCROLL", parameters={"lines": 10}), "succeeded"),
        Expectation("web SCREENSHOT", _instruction("SCREENSHOT"), "succeeded"),
    ]


def process_batch() -> list[Expectation]:
    out = '"$HUNTER_OUTPUT_DIR/result.txt"'
    return [
        Expectation(
            "process writes declared file",
            _process(
                ["sh", "-c", f"echo hello > {out}"],
                declared_outputs=[{"path": "result.txt", "role": "report"}],
            ),
            "succeeded",
        ),
        Expectation("process exits 3", _process(["sh", "-c", "exit 3"]), "failed"),
        Expectation(
            "process exits 3 in GREEN",
            _process(["sh", "-c", "exit 3"], phase="GREEN"),
            "exhausted",
            ("RETRY", "RETRY", "EXHAUSTED"),
        ),
        Expectation(
            "process sleeps past deadline",
            _process(["sleep", "10"], timeout_ms=300),
            "timeout",
            ("RETRY", "RETRY", "TERMINATE"),
        ),
        Expectation(
            "process writes undeclared file",
            _process(["sh", "-c", 'echo x > "$HUNTER_OUTPUT_DIR/sneaky.txt"']),
            "violation",
        ),
        Expectation(
            "process exceeds memory limit",
            _process(["python3", "-c", "b = bytearray(512 << 20)"]),
            "escalated",
            ("ESCALATE",),
        ),
    ]


#: Chaos executors of the second round: (id, command advertised, behaviour spec).
CHAOS_ROUND: Final[tuple[tuple[str, str, str], ...]] = (
    ("chaos-flaky", "READ", "error,ok"),
    ("chaos-crash", "CLICK", "crash"),
    ("chaos-backup", "CLICK", "ok"),
    ("chaos-hang", "SCROLL", "hang"),
    ("chaos-liar", "EXTRACT", "wrong-id"),
    ("chaos-authority", "SCREENSHOT", "authority"),
    ("chaos-partial", "NAVIGATE", "partial"),
)
CHAOS_ROUND_2: Final[tuple[tuple[str, str, str], ...]] = (
    ("chaos-refuse", "READ", "refuse"),
    ("chaos-no-evidence", "EXTRACT", "no-evidence"),
)


def chaos_batch() -> list[Expectation]:
    return [
        Expectation(
            "chaos errors, then recovers",
            _instruction("READ", target_selector="#title"),
            "succeeded",
            ("RETRY", "SUCCEED"),
        ),
        Expectation(
            "chaos crashes; retry elsewhere",
            _instruction("CLICK", target_selector="#hello"),
            "succeeded",
            ("RETRY", "SUCCEED"),
        ),
        Expectation(
            "chaos hangs",
            _instruction("SCROLL", timeout_ms=300),
            "timeout",
            ("RETRY", "RETRY", "TERMINATE"),
        ),
        Expectation(
            "chaos lies (wrong id)",
            _instruction("EXTRACT", target_selector="li"),
            "terminated",
            ("TERMINATE",),
        ),
        Expectation(
            "chaos claims authority",
            _instruction("SCREENSHOT"),
            "violation",
            ("TERMINATE",),
        ),
        Expectation(
            "chaos partial output",
            _instruction("NAVIGATE", target_url="http://127.0.0.1:9/"),
            "terminated",
            ("TERMINATE",),
        ),
    ]


def chaos_batch_2() -> list[Expectation]:
    return [
        Expectation("chaos refuses", _instruction("READ", target_selector="p"), "terminated"),
        Expectation(
            "chaos SUCCESS without evidence",
            _instruction("EXTRACT", target_selector="p"),
            "terminated",
        ),
    ]
