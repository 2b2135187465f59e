"""The fleet nemesis (docs/nemesis.md): a short seeded run for CI, and its pieces on their own.

`test_nemesis_short_run` is the CI run: three daemons on one PostgreSQL, each behind its proxy,
two no-op executors each, a fixed seed, two busy-loop processes starving the CPU, and the faults
that matter most to the fleet's guarantees: SIGSTOP of a daemon past its lease (8 s on a 2 s
lease) and SIGKILL with a restart. The checker's verdict must be clean. ``scripts/nemesis.py``
runs the long ones (every fault kind, many seeds).

The other tests need no daemon: the checker fed hand-made histories, store snapshots, ledger
files, run records and logs (so that a check that cannot fail is noticed), the fault schedule,
and the proxy's delay, black hole and cut on a local echo server.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson
import pytest

from tests.storms.checker import (
    CliResult,
    LedgerLine,
    StoreSnapshot,
    StoreTurn,
    Takeover,
    check_acknowledged,
    check_answers,
    check_deadlocks,
    check_ledger_files,
    check_ledger_store,
    check_logs,
    check_run_records,
    check_takeovers,
    longest_call,
)
from tests.storms.history import History, Op, read_history
from tests.storms.nemesis import schedule
from tests.storms.proxy import Proxy
from tests.storms.run import NemesisConfig, run_nemesis

SEED = int(os.environ.get("HUNTER_NEMESIS_SEED", "11"))
CI_RUN = NemesisConfig(
    seed=SEED,
    duration_s=75.0,
    turns=500,
    faults=("pause", "kill"),
    starve=2,
    settle_s=30.0,
)


@pytest.mark.slow
async def test_nemesis_short_run(headline: Callable[[str, str], None]) -> None:
    """Under CPU starvation, a daemon SIGSTOPped past its lease and another SIGKILLed and
    restarted: every acknowledged turn ends exactly once, in the store and in every ledger
    file, no process turn runs twice, every takeover is prompt, the logs are clean."""
    progress: list[str] = []
    with anyio.fail_after(240):
        verdict = await run_nemesis(CI_RUN, show=progress.append)
    headline("nemesis", verdict.summary())
    report = "\n".join([verdict.summary(), *verdict.details(), "progress:", *progress])
    assert {f.split()[1] for f in verdict.faults} >= {"pause", "kill"}, report
    assert verdict.acknowledged == CI_RUN.turns, report
    assert verdict.ok, report


# -- the checker on hand-made inputs -------------------------------------------------------------

SID = "SES-1"


def _op(call: int, key: str, daemon: str, type_: str, turn_id: int | None, **kw: Any) -> Op:
    return Op(
        call=call,
        key=key,
        daemon=daemon,
        kind=kw.get("kind", "instruction"),
        session_id=SID,
        attempt=kw.get("attempt", 1),
        invoked=float(call),
        completed=kw.get("completed", float(call) + 0.5),
        type=type_,
        turn_id=turn_id,
        created=kw.get("created", True),
        error="",
        code=kw.get("code", ""),
    )


def _entry(ledger: str, seq: int, previous: str, **fields: Any) -> LedgerLine:
    digest = hashlib.sha256(f"{ledger}{seq}{fields}".encode()).hexdigest()
    entry = {
        "ledger_id": f"{SID}/{ledger}",
        "seq": seq,
        "previous_hash": previous,
        "entry_hash": digest,
        **fields,
    }
    return LedgerLine(seq, digest, entry)


def _store(
    turns: list[StoreTurn],
    exec_fields: list[dict[str, Any]],
    evidence_fields: list[dict[str, Any]],
) -> StoreSnapshot:
    lines: dict[str, list[LedgerLine]] = {}
    for ledger, fields in (("exec", exec_fields), ("evidence", evidence_fields)):
        previous = "0" * 64
        chain = []
        for seq, f in enumerate([{"kind": "session_opened"}, *fields], start=1):
            line = _entry(ledger, seq, previous, **f)
            chain.append(line)
            previous = line.entry_hash
        lines[f"{SID}/{ledger}"] = chain
    heads = {ledger_id: (c[-1].seq, c[-1].entry_hash) for ledger_id, c in lines.items()}
    return StoreSnapshot(turns=turns, lines=lines, heads=heads)


def _turn(turn_id: int, state: str = "succeeded", kind: str = "instruction") -> StoreTurn:
    return StoreTurn(turn_id, SID, turn_id, kind, f"k{turn_id}", state)


def _ending(turn_id: int, status: str = "succeeded") -> dict[str, Any]:
    return {"kind": "turn", "turn_number": turn_id, "status": status}


def _evidence(turn_id: int, **extra: Any) -> dict[str, Any]:
    return {"kind": "turn", "turn_number": turn_id, **extra}


def test_acknowledged_turns_must_be_final_and_one_per_key() -> None:
    """A key answered with two turn ids, two answers saying created=true for one key and an
    acknowledged turn that never ended are each a problem; a clean history is not."""
    store = _store([_turn(1), _turn(2, "running")], [_ending(1)], [_evidence(1)])
    clean = check_acknowledged([_op(1, "k1", "a", "ok", 1)], store)
    assert clean.ok, clean.problems
    bad = check_acknowledged(
        [
            _op(1, "k1", "a", "ok", 1),
            _op(2, "k1", "b", "ok", 3, attempt=2),
            _op(3, "k2", "a", "info", None, code="timeout"),
            _op(4, "k2", "b", "ok", 2, attempt=2, created=True),
            _op(5, "k2", "c", "ok", 2, attempt=3, created=True),
        ],
        store,
    )
    text = "\n".join(bad.problems)
    assert "key k1: acknowledged as different turns [1, 3]" in text
    assert "acknowledged turn 3 is not in the store" in text
    assert "key k2: acknowledged turn 2 is not final (running)" in text
    assert "key k1: 2 submissions answered created=true (a#1->1, b#2->3)" in text
    assert "key k2: 2 submissions answered created=true (b#2->2, c#3->2)" in text
    assert bad.kinds["duplicate"] == 3


def test_daemons_must_agree_with_the_store() -> None:
    """A daemon that answers another state than the store's is named."""
    store = _store([_turn(1)], [_ending(1)], [_evidence(1)])
    assert check_answers({"a": {1: "succeeded"}}, store, [1]).ok
    wrong = check_answers({"a": {1: "succeeded"}, "b": {1: "running"}}, store, [1])
    assert wrong.problems == [
        "daemon b disagrees with the store on 1 turns: turn 1: running, store succeeded"
    ]


def test_a_turn_ended_twice_in_the_store_ledger_is_a_duplicate() -> None:
    """Two final exec entries (and two evidence entries) for one turn, an ending for a turn
    that is still running, and a broken head are found; one entry pair per turn is clean."""
    clean = _store([_turn(1), _turn(2, "running")], [_ending(1)], [_evidence(1)])
    assert check_ledger_store(clean).ok
    twice = _store(
        [_turn(1), _turn(2, "running")],
        [_ending(1), _ending(1), _ending(2)],
        [_evidence(1), _evidence(1), _evidence(2)],
    )
    check = check_ledger_store(twice)
    text = "\n".join(check.problems)
    assert "turn 1 (session SES-1 #1, instruction, succeeded): 2 final exec entries" in text
    assert "2 evidence entries (seqs [2, 3]), 1 due" in text
    assert "turn 2 (session SES-1 #2, instruction, running): not ended, but 1 final" in text
    assert check.kinds["duplicate"] == 2
    broken = StoreSnapshot(clean.turns, clean.lines, {**clean.heads, f"{SID}/exec": (1, "x")})
    assert any("ledger_heads says (1, 'x')" in p for p in check_ledger_store(broken).problems)


def _write_ledgers(session_dir: Path, store: StoreSnapshot, *, extra: LedgerLine | None) -> None:
    ledger = session_dir / "ledger"
    ledger.mkdir(parents=True)
    for which in ("exec", "evidence"):
        lines = [orjson.dumps(dict(line.entry)) for line in store.lines[f"{SID}/{which}"]]
        if extra is not None and which == "exec":
            lines.append(orjson.dumps(dict(extra.entry)))
        (ledger / f"{which}.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def test_ledger_files_must_hold_only_the_stores_lines(tmp_path: Path) -> None:
    """A file line the store does not hold (a stale copy that went on past it) and a file
    with two final entries of one turn are found; so is a failed ``verify --store``."""
    store = _store([_turn(1)], [_ending(1)], [_evidence(1)])
    root = tmp_path / "a"
    _write_ledgers(root / "planes/default/sessions" / SID, store, extra=None)
    assert check_ledger_files({"a": root}, store, [CliResult("verify", 0, "")]).ok
    previous = store.lines[f"{SID}/exec"][-1].entry_hash
    forked = _entry("exec", 3, previous, **_ending(1))
    _write_ledgers(root / "planes/default/stale" / f"{SID}-1", store, extra=forked)
    plain = (
        "ok x/exec.jsonl: 2 entries\nx/evidence.jsonl: seq 2: bad link\n"
        "1 ledgers intact, 1 target failed\n"
    )
    cli = [
        CliResult("verify b", 1, "--  S2: homed by d, checked there\nMISMATCH x\n"),
        CliResult("verify c", 1, plain),
    ]
    check = check_ledger_files({"a": root}, store, cli)
    text = "\n".join(check.problems)
    assert f"a:planes/default/stale/{SID}-1/exec.jsonl seq 3 (turn_number 1" in text
    assert "2 final entries for turn_number 1" in text
    assert "verify b exited 1: MISMATCH x\n" in text + "\n"
    assert (
        "verify c exited 1: x/evidence.jsonl: seq 2: bad link; 1 ledgers intact, 1 target" in text
    )


def _record(workspace: Path, key: str, roots: Mapping[str, Path], *runs: str) -> bytes:
    data = "".join(f"{key} 1 {roots[r]}/output/{SID} {i}\n" for i, r in enumerate(runs)).encode()
    (workspace / f"run-{key}.log").write_bytes(data)
    return data


def test_a_process_turn_that_ran_twice_is_found(tmp_path: Path) -> None:
    """A run record with two lines (promoted by two daemons) is a double run; a record that
    is not what the evidence entry says was promoted, and a succeeded turn without a record,
    are found too."""
    roots = {"a": tmp_path / "a", "b": tmp_path / "b"}
    workspace = tmp_path / "ws"
    workspace.mkdir()
    once = _record(workspace, "k1", roots, "a")
    _record(workspace, "k2", roots, "a", "b")
    promoted = [
        _evidence(n, promoted_outputs=[{"path": f"run-k{n}.log", "sha256": sha}])
        for n, sha in ((1, hashlib.sha256(once).hexdigest()), (2, "0" * 64))
    ]
    turns = [_turn(n, kind="process") for n in (1, 2, 3)]
    store = _store(turns, [_ending(1), _ending(2), _ending(3)], [*promoted, _evidence(3)])
    check = check_run_records({SID: workspace}, roots, store)
    text = "\n".join(check.problems)
    assert (
        "key k2 (turn 2, session SES-1): ran to completion 2 times, on daemons ['a', 'b']" in text
    )
    assert "key k2 (turn 2, session SES-1): the workspace record" in text
    assert "key k3 (turn 3): succeeded, no run record" in text
    assert "key k1" not in text
    assert check.kinds["double-run"] == 1


def test_logs_tracebacks_and_unexpected_errors_are_found(tmp_path: Path) -> None:
    """Tracebacks and error events are problems (grouped by shape, counted), expected error
    events are noted, and a daemon that died by itself is named."""
    log = tmp_path / "a.log"
    events = [
        {"level": "info", "event": "daemon_ready"},
        {"level": "error", "event": "store_unavailable", "error": "refused"},
        {"level": "warning", "event": "claim_lost", "turn_id": 3},
        {"level": "error", "event": "turn_crashed", "exception": "Traceback ...\nKeyError: 7"},
        {"level": "error", "event": "session_adopt_failed", "error": "seq 0 below 12"},
        {"level": "error", "event": "session_adopt_failed", "error": "seq 0 below 13"},
    ]
    lines = [orjson.dumps(e).decode() for e in events]
    lines += ["Traceback (most recent call last):", '  File "x.py"', "RuntimeError: boom"]
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    check, found = check_logs({"a": log}, {"a": None})
    text = "\n".join(check.problems)
    assert "traceback: a log line 4: error 'turn_crashed': KeyError: 7" in text
    assert "Traceback (most recent call last): ... RuntimeError: boom" in text
    assert "error event: x2, first: a log line 5: error 'session_adopt_failed'" in text
    assert "daemon a was not running at the end" in text
    assert found.expected["store_unavailable"] == 1
    assert found.noticed["claim_lost"] == 1
    assert len(found.unexpected) == 2


def test_takeovers_deadlocks_and_the_longest_call() -> None:
    """A takeover over its bound, or ended by the daemon coming back, is slow; a deadlock in
    the server log is a problem; the longest call counts one never answered until the end."""
    measured = [
        Takeover("kill", "a", 2, 1.5, "taken over"),
        Takeover("pause", "b", 2, 8.0, "daemon back"),
        Takeover("pause", "c", 0, 0.0, "homed none"),
    ]
    check = check_takeovers(measured, bound_s=6.0)
    assert len(check.problems) == 1
    assert "pause of daemon b (2 sessions): daemon back after 8.00 s" in check.problems[0]
    deadlocks, count = check_deadlocks("x ERROR:  deadlock detected\nDETAIL: ...\n")
    assert count == 1
    assert not deadlocks.ok
    ops = [_op(1, "k1", "a", "ok", 1), _op(2, "k2", "b", "pending", None, completed=None)]
    waited, which = longest_call(ops, ended=12.0)
    assert waited == 10.0
    assert which is not None
    assert which.key == "k2"


def test_history_pairs_invocations_with_completions(tmp_path: Path) -> None:
    """Each invocation is paired with its completion by call id; one without a completion is
    pending; fault events are kept apart."""
    history = History(tmp_path / "h.jsonl")
    first = history.invoke(key="k1", daemon="a", kind="process", session_id=SID, attempt=1)
    second = history.invoke(key="k1", daemon="b", kind="process", session_id=SID, attempt=2)
    history.record("nemesis", f="pause", phase="start", target="a")
    history.complete(second, "ok", turn_id=5, created=True)
    history.complete(first, "info", code="timeout", error="no answer")
    history.close()
    ops, others = read_history(tmp_path / "h.jsonl")
    assert [(op.call, op.type, op.turn_id) for op in ops] == [(1, "info", None), (2, "ok", 5)]
    assert [e["f"] for e in others] == ["pause"]


def test_the_schedule_is_drawn_from_the_seed() -> None:
    """The same seed draws the same faults; each requested kind comes at least once; the
    pause is the requested length; an unknown kind is refused."""
    faults = schedule(7, ("pause", "kill", "delay"), duration_s=60, pause_s=8.0)
    assert faults == schedule(7, ("pause", "kill", "delay"), duration_s=60, pause_s=8.0)
    assert faults != schedule(8, ("pause", "kill", "delay"), duration_s=60, pause_s=8.0)
    assert {f.kind for f in faults[:3]} == {"pause", "kill", "delay"}
    assert all(f.hold_s == 8.0 for f in faults if f.kind == "pause")
    assert all(200 <= f.delay_ms <= 800 for f in faults if f.kind == "delay")
    assert all(f.at_s < 60 for f in faults)
    with pytest.raises(ValueError, match=r"^unknown fault kinds \['nap'\]"):
        schedule(1, ("nap",), duration_s=10)


# -- the proxy ------------------------------------------------------------------------------------


async def _echo(stream: anyio.abc.SocketStream) -> None:
    async with stream:
        try:
            while True:
                await stream.send(await stream.receive())
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return


async def _round_trip(port: int, data: bytes) -> tuple[bytes, float]:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        started = anyio.current_time()
        await stream.send(data)
        got = await stream.receive()
        return got, anyio.current_time() - started


async def test_proxy_delays_black_holes_and_cuts() -> None:
    """Through the proxy, bytes come back as sent; with a delay each direction waits it; in a
    black hole nothing passes until it heals; a cut closes the open connections."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    upstream = int(listener.extra(anyio.abc.SocketAttribute.local_port))
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, _echo)
        proxy = Proxy("a", upstream_port=upstream)
        port = await tg.start(proxy.serve)
        with anyio.fail_after(10):
            assert (await _round_trip(port, b"hello"))[0] == b"hello"
            proxy.set_delay(0.15)
            got, took = await _round_trip(port, b"slow")
            assert got == b"slow"
            assert took >= 0.3
            proxy.set_delay(0.0)
            proxy.set_black_hole(True)
            with anyio.move_on_after(0.4) as blocked:
                await _round_trip(port, b"lost?")
            assert blocked.cancelled_caught
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(b"later")
                await anyio.sleep(0.2)
                proxy.set_black_hole(False)
                assert await stream.receive() == b"later"
                assert proxy.cut() >= 1
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    await stream.receive()
        stats = proxy.statistics()
        assert stats.connections >= 4
        assert stats.errors == 0
        tg.cancel_scope.cancel()
