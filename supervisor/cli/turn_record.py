"""A turn's decision record, readable (``hunter turn show``; Temporal's ``workflow show`` is the
model): what was asked, how it ended and why, every attempt with its times, its wait for a slot
(``QUEUED_MS``; ``MS`` is how long it ran), fault, decision and the backoff before the next one,
a process turn's outputs, violations and stdout/stderr tails, an instruction turn's executor
answer, and the hashes of the turn's ledger entries.

The input is the JSON of the control API (``turn.get``: ``turn`` and ``ledger``); nothing here
talks to the daemon.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from supervisor.cli.output import table, to_json
from supervisor.wire.turn_spec import requested_by_text

__all__ = ["TAIL_LINES", "describe_turn"]

#: Lines of stdout/stderr shown (the last ones); ``--json`` has all the daemon kept.
TAIL_LINES: Final = 20
_ATTEMPT_COLUMNS: Final = (
    "ATTEMPT",
    "EXECUTOR",
    "STARTED",
    "ENDED",
    "QUEUED_MS",
    "MS",
    "OUTCOME",
    "FAULT",
    "EXIT",
    "DECISION",
    "REASON",
    "BACKOFF",
)
#: An instruction's executor output is shown as JSON up to this many characters.
_OUTPUT_CHARS: Final = 400


def _when(us: object, *, date: bool = True) -> str:
    if not isinstance(us, int):
        return "-"
    moment = datetime.fromtimestamp(us / 1_000_000, tz=UTC)
    text = moment.strftime("%Y-%m-%d %H:%M:%S.%f" if date else "%H:%M:%S.%f")[:-3]
    return text + ("Z" if date else "")


def _line(label: str, value: object) -> str:
    return f"  {label + ':':<8} {value}"


def _what(turn: Mapping[str, Any]) -> str:
    spec = turn["spec"]
    if turn["kind"] == "instruction":
        parts = (spec.get(k) for k in ("command_type", "target_url", "target_selector"))
        return " ".join(str(p) for p in parts if p)
    return " ".join(str(a) for a in spec.get("argv", []))


def _waited(turn: Mapping[str, Any]) -> str | None:
    """The "waited:" line: how long the attempts waited before they ran (their ``queued_ms``),
    for what; None when no attempt says."""
    known = [
        (a["attempt"], a["queued_ms"])
        for a in turn.get("attempts") or []
        if isinstance(a.get("queued_ms"), int)
    ]
    if not known:
        return None
    what = (
        "the session's lock and a process slot" if turn["kind"] == "process" else "an executor slot"
    )
    waits = [(n, q) for n, q in known if q]
    if len(waits) == 1:
        return f"{waits[0][1]} ms for {what} before attempt {waits[0][0]} ran"
    total = sum(q for _, q in waits)
    each = ", ".join(f"attempt {n}: {q} ms" for n, q in waits)
    return f"{total} ms for {what}" + (f" ({each})" if each else "")


def _header(turn: Mapping[str, Any]) -> list[str]:
    spec = turn["spec"]
    decided = f"  ({turn['verdict']} {turn['reason_code']})" if turn.get("verdict") else ""
    lines = [
        f"turn {turn['turn_id']}  session {turn['session_id']}  #{turn['turn_number']}",
        _line("kind", f"{turn['kind']}: {_what(turn)}"),
        _line("state", f"{turn['state']}{decided}"),
    ]
    if turn.get("reason"):
        lines.append(_line("reason", turn["reason"]))
    if turn.get("fault_type"):
        lines.append(_line("fault", turn["fault_type"]))
    by = (turn.get("result") or {}).get("decided_by")
    if isinstance(by, Mapping):  # a person's decision: who, from which uid, when, why
        why = f": {by['reason']}" if by.get("reason") else " (no reason given)"
        lines.append(
            _line(
                "decided",
                f"{by.get('action')} by {by.get('operator')} (uid {by.get('uid')})"
                f" at {_when(by.get('at_us'))}{why}",
            )
        )
    asked = [f"timeout {spec['timeout_ms']} ms"] if spec.get("timeout_ms") else []
    if spec.get("phase"):
        asked.append(f"phase {spec['phase']}")
    if turn.get("idempotency_key"):
        asked.append(f"idempotency key {turn['idempotency_key']!r}")
    if asked:
        lines.append(_line("asked", ", ".join(asked)))
    requested = requested_by_text(spec.get("requested_by"))
    if requested is not None:  # who asked, through a front end (`hunter mcp`)
        lines.append(_line("by", requested))
    lines.append(_line("accepted", _when(turn.get("accepted_us"))))
    waited = _waited(turn)
    if waited is not None:
        lines.append(_line("waited", waited))
    finished, accepted = turn.get("finished_us"), turn.get("accepted_us")
    if isinstance(finished, int) and isinstance(accepted, int):
        took = (finished - accepted) / 1000
        lines.append(_line("finished", f"{_when(finished)}  ({took:.1f} ms after acceptance)"))
    if turn.get("next_attempt_us") and not turn.get("final"):
        lines.append(_line("next", f"attempt at {_when(turn['next_attempt_us'])}"))
    return lines


def _attempts(turn: Mapping[str, Any]) -> list[str]:
    attempts: Sequence[Mapping[str, Any]] = turn.get("attempts") or []
    if not attempts:
        return ["", "attempts: none yet"]
    rows = []
    notes = []
    for a in attempts:
        delay = a.get("delay_ms")
        rows.append(
            (
                a["attempt"],
                a.get("executor_id") or ("sandbox" if turn["kind"] == "process" else "-"),
                _when(a.get("started_us"), date=False),
                _when(a.get("finished_us"), date=False) if a.get("finished_us") else "running",
                a.get("queued_ms") if a.get("queued_ms") is not None else "-",
                a.get("duration_ms") if a.get("duration_ms") is not None else "-",
                a.get("outcome") or "-",
                a.get("fault_type") or "-",
                a.get("exit_code") if a.get("exit_code") is not None else "-",
                a.get("decision") or "-",
                a.get("reason_code") or "-",
                f"{delay} ms" if a.get("decision") == "RETRY" and delay is not None else "-",
            )
        )
        extra = a.get("extra") or {}
        signal = extra.get("signal") if isinstance(extra, Mapping) else None
        why = "; ".join(
            str(x)
            for x in (a.get("reason"), a.get("detail"), f"signal {signal}" if signal else None)
            if x
        )
        if why:
            notes.append(f"  {a['attempt']}: {why}")
    return ["", table(_ATTEMPT_COLUMNS, rows), *notes]


def _outputs(turn: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    declared = turn["spec"].get("declared_outputs") or []
    lines = ["", "outputs"]
    lines += [
        f"  declared  {d['path']}" + (f" ({d['role']})" if d.get("role") else "")
        if isinstance(d, Mapping)
        else f"  declared  {d}"
        for d in declared
    ] or ["  declared  (none)"]
    realized = result.get("realized_writes") or []
    lines += [
        f"  realized  {w.get('path')}  {w.get('size')} bytes  sha256 {w.get('sha256')}"
        + (f"  ({w['area']})" if w.get("area") not in (None, "output") else "")
        for w in realized
    ] or ["  realized  (none)"]
    lines += [
        f"  promoted  {p.get('path')} -> {p.get('destination')}"
        for p in result.get("promoted_outputs") or []
    ]
    return lines


def _violations(result: Mapping[str, Any], ledger: Mapping[str, Any] | None) -> list[str]:
    found = list(result.get("violations") or [])
    if not found and ledger is not None:  # a turn that ended without a result: the evidence
        found = [
            v
            for e in ledger.get("evidence", [])
            for v in e.get("capability_violations") or []
            if isinstance(v, Mapping)
        ]
    if not found:
        return ["", "violations: none"]
    return [
        "",
        "violations",
        *(
            f"  {v.get('operation')} {v.get('target')}: {v.get('detail')}"
            f" (capability {v.get('capability')})"
            for v in found
        ),
    ]


def _tail(name: str, text: object, truncated: bool) -> list[str]:
    if not isinstance(text, str) or not text:
        return ["", f"{name}: (empty)"]
    lines = text.rstrip("\n").split("\n")
    shown = lines[-TAIL_LINES:]
    notes = []
    if len(lines) > len(shown):
        notes.append(f"the last {len(shown)} of {len(lines)} lines; --json has all")
    if truncated:
        notes.append("cut by the package's output limit")
    return [
        "",
        f"{name}" + (f" ({'; '.join(notes)})" if notes else ""),
        *(f"  | {x}" for x in shown),
    ]


def _process(turn: Mapping[str, Any], result: Mapping[str, Any], ledger: Any) -> list[str]:
    attempts = result.get("attempts") or [{}]
    last = attempts[-1] if isinstance(attempts[-1], Mapping) else {}
    return [
        *_outputs(turn, result),
        *_violations(result, ledger),
        *_tail("stdout", result.get("stdout"), bool(last.get("stdout_truncated"))),
        *_tail("stderr", result.get("stderr"), bool(last.get("stderr_truncated"))),
    ]


def _instruction(result: Mapping[str, Any]) -> list[str]:
    lines = ["", "executor answer"]
    for key in ("executor_id", "response_type", "evidence_hash", "safety_reason_code"):
        if result.get(key):
            lines.append(f"  {key:<19}{result[key]}")
    if result.get("partial"):
        lines.append(f"  {'partial':<19}yes")
    for key in ("error_message", "detail"):
        if result.get(key):
            lines.append(f"  {key:<19}{result[key]}")
    if result.get("output"):
        text = to_json(result["output"]).replace("\n", " ")
        text = " ".join(text.split())
        if len(text) > _OUTPUT_CHARS:
            text = text[:_OUTPUT_CHARS] + " ... (--json has all)"
        lines.append(f"  {'output':<19}{text}")
    return lines if len(lines) > 2 else ["", "executor answer: none"]


def _ledger(turn: Mapping[str, Any], ledger: Mapping[str, Any] | None) -> list[str]:
    if ledger is None:
        return []
    lines = ["", "ledger entries"]
    for name in ("exec", "evidence"):
        for e in ledger.get(name) or []:
            status = f"  status {e['status']}" if e.get("status") else ""
            lines.append(f"  {name:<9}seq {e.get('seq')}  {e.get('kind')}{status}")
            lines.append(f"    entry_hash     {e.get('entry_hash')}")
            lines.append(f"    previous_hash  {e.get('previous_hash')}")
            for key in ("query_hash", "result_hash"):
                if e.get(key):
                    lines.append(f"    {key:<15}{e[key]}")
    if len(lines) == 2:
        waiting = "not in the files yet" if turn.get("final") else "the turn has not ended"
        return ["", f"ledger entries: none ({waiting})"]
    return lines


def describe_turn(turn: Mapping[str, Any], ledger: Mapping[str, Any] | None = None) -> str:
    """A readable multi-line decision record of *turn* (``turn.get``'s ``turn``); with
    *ledger* (``turn.get``'s ``ledger``) also the hashes of its ledger entries."""
    result: Mapping[str, Any] = turn.get("result") or {}
    lines = [*_header(turn), *_attempts(turn)]
    if turn["kind"] == "process" and result:
        lines += _process(turn, result, ledger)
    elif turn["kind"] == "process":
        lines += [*_outputs(turn, {})[:-1], "", "result: none yet"]
    elif result:
        lines += _instruction(result)
    lines += _ledger(turn, ledger)
    return "\n".join(lines)
