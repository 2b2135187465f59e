"""End to end: a real `hunter serve` process, real sockets, real executor processes.

Each test gets a fresh root with a fast config; after each test every session ledger under the
root must verify. Synchronisation is by events the daemon reports (READY=1 on NOTIFY_SOCKET,
`executors.wait`, `turn.wait` with `until`), never by sleeping.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import verify_root
from supervisor.control.client import ControlClient, ControlClientError
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root

pytestmark = pytest.mark.slow

FAST_CONFIG = DEMO_CONFIG.replace("queue_wait_s = 3.0", "queue_wait_s = 5.0")


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root other users can traverse (process turns run under their own uid; pytest's
    tmp_path is private to root), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="hh-e2e-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def stack(root: Path) -> AsyncIterator[DemoStack]:
    """A running daemon on a fresh root; ledgers are verified when the test is done."""
    config = prepare_root(root, fresh=True, config_text=FAST_CONFIG)
    s = DemoStack(root=root, config_path=config)
    try:
        await s.start_daemon()
        yield s
    finally:
        await s.aclose()
    report = verify_root(root, workers=1)
    assert report.ok, report.errors


async def chaos(s: DemoStack, executor_id: str, command: str, behaviour: str) -> None:
    await s.start_executor(
        executor_id,
        [
            "supervisor.examples.chaos_executor",
            "--commands",
            command,
            "--behaviour",
            behaviour,
            "--no-reconnect",
        ],
    )


async def session(client: ControlClient) -> str:
    return str((await client.call("session.open", package_id="demo"))["session_id"])


async def run(client: ControlClient, sid: str, **params: Any) -> dict[str, Any]:
    params.setdefault("declared_outputs", [])
    submitted = await client.call("turn.submit", session_id=sid, **params)
    result = await client.call("turn.wait", turn_id=submitted["turn"]["turn_id"], timeout_s=30)
    return dict(result["turn"])


def decisions(turn: dict[str, Any]) -> list[tuple[str | None, str | None]]:
    return [(a["fault_type"], a["decision"]) for a in turn["attempts"]]


async def test_success_on_web_executor(stack: DemoStack) -> None:
    """NAVIGATE then READ on the working executor succeed with real evidence."""
    await stack.start_executor(
        "web-1", ["supervisor.examples.web_executor", "--serve-pages"], capture_first_line=True
    )
    async with ControlClient(stack.control_socket) as client:
        sid = await session(client)
        nav = await run(
            client,
            sid,
            kind="instruction",
            command_type="NAVIGATE",
            target_url=stack.page_base_url + "/",
        )
        read = await run(
            client, sid, kind="instruction", command_type="READ", target_selector="#title"
        )
        assert (nav["state"], read["state"]) == ("succeeded", "succeeded")
        assert read["result"]["output"]
        assert len(read["result"]["evidence_hash"]) == 64
        assert read["attempts"][0]["executor_id"] == "web-1"


async def test_retry_then_success(stack: DemoStack) -> None:
    """An ERROR answer (CRASH) is retried after the backoff and the retry succeeds."""
    await chaos(stack, "flaky", "READ", "error,ok")
    async with ControlClient(stack.control_socket) as client:
        turn = await run(
            client,
            await session(client),
            kind="instruction",
            command_type="READ",
            target_selector="h1",
        )
    assert turn["state"] == "succeeded"
    assert decisions(turn) == [("CRASH", "RETRY"), (None, "SUCCEED")]


async def test_timeout_retries_then_terminates(stack: DemoStack) -> None:
    """A hanging executor times out three times; the turn ends `timeout`."""
    await chaos(stack, "hang", "SCROLL", "hang")
    async with ControlClient(stack.control_socket) as client:
        turn = await run(
            client, await session(client), kind="instruction", command_type="SCROLL", timeout_ms=200
        )
    assert turn["state"] == "timeout"
    assert decisions(turn) == [("TIMEOUT", "RETRY"), ("TIMEOUT", "RETRY"), ("TIMEOUT", "TERMINATE")]
    assert turn["reason_code"] == "TIMEOUT_RETRY_LIMIT_REACHED"


async def test_disconnect_mid_instruction_is_crash_and_retry_moves(stack: DemoStack) -> None:
    """An executor that dies mid-instruction is a CRASH; the retry runs on another executor."""
    await chaos(stack, "crasher", "CLICK", "crash")
    await chaos(stack, "backup", "CLICK", "ok")
    async with ControlClient(stack.control_socket) as client:
        turn = await run(
            client,
            await session(client),
            kind="instruction",
            command_type="CLICK",
            target_selector="#hello",
        )
    assert turn["state"] == "succeeded"
    assert decisions(turn) == [("CRASH", "RETRY"), (None, "SUCCEED")]
    assert [a["executor_id"] for a in turn["attempts"]] == ["crasher", "backup"]


@pytest.mark.parametrize(
    ("behaviour", "fault", "state"),
    [
        ("wrong-id", "INVALID_RESPONSE", "terminated"),
        ("partial", "PARTIAL", "terminated"),
    ],
)
async def test_lying_executor_terminates(
    stack: DemoStack, behaviour: str, fault: str, state: str
) -> None:
    """Invalid and partial responses end the turn at once (no retry)."""
    await chaos(stack, "liar", "EXTRACT", behaviour)
    async with ControlClient(stack.control_socket) as client:
        turn = await run(
            client,
            await session(client),
            kind="instruction",
            command_type="EXTRACT",
            target_selector="li",
        )
    assert turn["state"] == state
    assert decisions(turn) == [(fault, "TERMINATE")]


async def test_authority_claim_quarantines_executor(stack: DemoStack) -> None:
    """A response claiming authority is a SECURITY_VIOLATION; the executor is quarantined."""
    await chaos(stack, "rogue", "SCREENSHOT", "authority")
    async with ControlClient(stack.control_socket) as client:
        turn = await run(
            client, await session(client), kind="instruction", command_type="SCREENSHOT"
        )
        executors = (await client.call("executors.list"))["executors"]
    assert turn["state"] == "violation"
    assert decisions(turn) == [("SECURITY_VIOLATION", "TERMINATE")]
    (rogue,) = [e for e in executors if e["executor_id"] == "rogue"]
    assert rogue["quarantined_until_us"]


async def test_resource_exhausted_escalates_until_operator_decides(stack: DemoStack) -> None:
    """A process turn over its memory limit is escalated; retry re-runs it, terminate ends it."""
    async with ControlClient(stack.control_socket) as client:
        sid = await session(client)
        turn = await run(
            client, sid, kind="process", argv=["python3", "-c", "b = bytearray(512 << 20)"]
        )
        assert turn["state"] == "escalated"
        assert decisions(turn) == [("RESOURCE_EXHAUSTED", "ESCALATE")]
        listed = (await client.call("escalations.list"))["escalations"]
        assert [t["turn_id"] for t in listed] == [turn["turn_id"]]
        await client.call(
            "escalations.resolve", turn_id=turn["turn_id"], action="retry", reason="try again"
        )
        again = (await client.call("turn.wait", turn_id=turn["turn_id"], timeout_s=30))["turn"]
        assert again["state"] == "escalated"
        done = await client.call(
            "escalations.resolve", turn_id=turn["turn_id"], action="terminate", reason="too big"
        )
        assert done["turn"]["state"] == "terminated"
        assert done["turn"]["reason_code"] == "OPERATOR_TERMINATED"


async def test_process_turns_outcomes(stack: DemoStack) -> None:
    """Process turns: declared write succeeds, exit 3 fails, undeclared write is a violation."""
    async with ControlClient(stack.control_socket) as client:
        sid = await session(client)
        ok = await run(
            client,
            sid,
            kind="process",
            argv=["sh", "-c", 'echo hi > "$HUNTER_OUTPUT_DIR/out.txt"'],
            declared_outputs=[{"path": "out.txt", "role": "report"}],
        )
        failed = await run(client, sid, kind="process", argv=["sh", "-c", "exit 3"])
        sneaky = await run(
            client, sid, kind="process", argv=["sh", "-c", 'echo x > "$HUNTER_OUTPUT_DIR/x"']
        )
    assert (ok["state"], failed["state"], sneaky["state"]) == ("succeeded", "failed", "violation")
    assert failed["attempts"][0]["exit_code"] == 3


async def test_process_attempts_carry_their_own_times(stack: DemoStack) -> None:
    """Each attempt of a process turn records when it ran (it once carried the turn's start and
    end): in order, apart by the backoff, each as long as its duration."""
    async with ControlClient(stack.control_socket) as client:
        sid = await session(client)
        turn = await run(client, sid, kind="process", argv=["sleep", "10"], timeout_ms=300)
    attempts = turn["attempts"]
    assert [a["decision"] for a in attempts] == ["RETRY", "RETRY", "TERMINATE"]
    for a in attempts:
        took_us = a["finished_us"] - a["started_us"]
        assert took_us >= 300_000  # its own timeout, at least
        # `sleep` has no SIGTERM handler: as PID 1 of its namespace it would ignore the
        # deadline's SIGTERM, so it is killed at once rather than after the 2 s grace
        assert a["duration_ms"] < 1_500
        assert abs(took_us - a["duration_ms"] * 1000) < 5_000
    for before, after in itertools.pairwise(attempts):
        assert after["started_us"] >= before["finished_us"] + before["delay_ms"] * 1000 - 5_000


async def test_backpressure_queue_full(root: Path) -> None:
    """With no executor and a queue of one, a further submit gets queue_full + retry_after_ms;
    nothing accepted is dropped: the queued turns run once an executor arrives (within their
    wait for one: 30 s here, then they would end NO_CAPABLE_EXECUTOR)."""
    config = prepare_root(
        root,
        fresh=True,
        config_text=FAST_CONFIG.replace("[executors]", "[executors]\nqueue_capacity = 1").replace(
            "queue_wait_s = 5.0", "queue_wait_s = 30.0"
        ),
    )
    s = DemoStack(root=root, config_path=config)
    try:
        await s.start_daemon()
        async with ControlClient(s.control_socket) as client:
            sid = await session(client)
            accepted: list[int] = []
            refusal: ControlClientError | None = None
            for _ in range(20):
                try:
                    r = await client.call(
                        "turn.submit",
                        session_id=sid,
                        kind="instruction",
                        command_type="READ",
                        target_selector="h1",
                        timeout_ms=30_000,
                        declared_outputs=[],
                    )
                except ControlClientError as exc:
                    refusal = exc
                    break
                accepted.append(r["turn"]["turn_id"])
            assert refusal is not None
            assert refusal.code == "queue_full"
            assert refusal.details["retry_after_ms"] > 0
            await chaos(s, "late", "READ", "ok")
            for turn_id in accepted:
                turn = (await client.call("turn.wait", turn_id=turn_id, timeout_s=30))["turn"]
                assert turn["state"] == "succeeded"
    finally:
        await s.aclose()
    assert verify_root(root, workers=1).ok


async def test_idempotent_resubmission(stack: DemoStack) -> None:
    """Submitting twice with one idempotency key returns the same turn, run once."""
    await chaos(stack, "ok", "READ", "ok")
    async with ControlClient(stack.control_socket) as client:
        sid = await session(client)
        params: dict[str, Any] = {
            "session_id": sid,
            "kind": "instruction",
            "command_type": "READ",
            "target_selector": "h1",
            "declared_outputs": [],
            "idempotency_key": "same",
        }
        first = await client.call("turn.submit", **params)
        second = await client.call("turn.submit", **params)
        assert first["created"] is True
        assert second["created"] is False
        assert second["turn"]["turn_id"] == first["turn"]["turn_id"]
        done = (await client.call("turn.wait", turn_id=first["turn"]["turn_id"]))["turn"]
        assert len(done["attempts"]) == 1


async def test_bad_input_keeps_accepted_work(stack: DemoStack) -> None:
    """Malformed requests get structured errors; a garbage frame closes only that connection."""
    async with ControlClient(stack.control_socket) as client:
        sid = await session(client)
        accepted = await client.call(
            "turn.submit", session_id=sid, kind="process", argv=["true"], declared_outputs=[]
        )
        with pytest.raises(ControlClientError) as info:
            await client.call("turn.submit", session_id=sid, kind="process", argv=["true"])
        assert info.value.code == "bad_request"
        assert info.value.message.startswith("declared_outputs: is required")
    async with await anyio.connect_unix(stack.control_socket) as raw:
        await raw.send(b"\x00\x00\x00\x05hello")
        answer = b""
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            while True:
                answer += await raw.receive()
        assert b"bad frame" in answer
    async with ControlClient(stack.control_socket) as client:
        turn = (await client.call("turn.wait", turn_id=accepted["turn"]["turn_id"]))["turn"]
        assert turn["state"] == "succeeded"


async def test_sigkill_restart_loses_nothing(stack: DemoStack) -> None:
    """Daemon SIGKILLed with attempts in flight: after a restart each interrupted attempt is a
    CRASH, the policy retries it, and every accepted turn finishes."""
    # three slots: all three attempts are in flight (none parked) when the daemon dies
    await stack.start_executor(
        "hang",
        [
            "supervisor.examples.chaos_executor",
            "--commands",
            "READ",
            "--behaviour",
            "hang",
            "--slots",
            "3",
            "--no-reconnect",
        ],
    )
    async with ControlClient(stack.control_socket) as client:
        sid = await session(client)
        ids = []
        for i in range(3):
            r = await client.call(
                "turn.submit",
                session_id=sid,
                kind="instruction",
                command_type="READ",
                target_selector=f"#t{i}",
                timeout_ms=20_000,
                declared_outputs=[],
            )
            ids.append(r["turn"]["turn_id"])
        await client.call("turn.wait", turn_id=ids[0], until=["running"])
        for turn_id in ids[1:]:
            await client.call("turn.wait", turn_id=turn_id, until=["running"])
    assert await stack.stop_daemon(signal.SIGKILL) == -signal.SIGKILL
    await stack.stop_executor("hang")
    await stack.start_daemon()
    await chaos(stack, "ok", "READ", "ok")
    async with ControlClient(stack.control_socket) as client:
        for turn_id in ids:
            turn = (await client.call("turn.wait", turn_id=turn_id, timeout_s=30))["turn"]
            assert turn["state"] == "succeeded"
            assert decisions(turn) == [("CRASH", "RETRY"), (None, "SUCCEED")]
            assert "interrupted" in (turn["attempts"][0]["detail"] or "")


async def test_sigterm_drains_in_flight_attempt(stack: DemoStack) -> None:
    """SIGTERM waits for the running attempt to finish, then exits 0; the turn succeeded."""
    await stack.start_executor(
        "slow",
        [
            "supervisor.examples.chaos_executor",
            "--commands",
            "READ",
            "--behaviour",
            "slow",
            "--delay-ms",
            "400",
            "--no-reconnect",
        ],
    )
    async with ControlClient(stack.control_socket) as client:
        sid = await session(client)
        r = await client.call(
            "turn.submit",
            session_id=sid,
            kind="instruction",
            command_type="READ",
            target_selector="h1",
            timeout_ms=5000,
            declared_outputs=[],
        )
        turn_id = r["turn"]["turn_id"]
        await client.call("turn.wait", turn_id=turn_id, until=["running"])
    assert await stack.stop_daemon(signal.SIGTERM) == 0
    await stack.start_daemon()
    async with ControlClient(stack.control_socket) as client:
        turn = (await client.call("turn.get", turn_id=turn_id))["turn"]
    assert turn["state"] == "succeeded"
    assert len(turn["attempts"]) == 1


async def test_second_signal_forces_exit(stack: DemoStack) -> None:
    """A SIGTERM during a drain (here started by the `drain` request) forces the exit (code 1);
    the attempt stays running in the intake and becomes a CRASH after the next start."""
    await chaos(stack, "hang", "READ", "hang")
    async with ControlClient(stack.control_socket) as client:
        sid = await session(client)
        r = await client.call(
            "turn.submit",
            session_id=sid,
            kind="instruction",
            command_type="READ",
            target_selector="h1",
            timeout_ms=60_000,
            declared_outputs=[],
        )
        turn_id = r["turn"]["turn_id"]
        await client.call("turn.wait", turn_id=turn_id, until=["running"])
        status = await client.call("status")
        assert status["turn_core"]["attempts_running"] == 1
        assert (await client.call("drain"))["draining"] is True
    # the drain now waits for the hanging attempt (grace 2 s): a signal forces the exit
    # (exactly one: a further SIGTERM during the forced exit's teardown meets the default
    # disposition and would kill the process, exit code -15)
    assert await stack.stop_daemon(signal.SIGTERM) == 1
    await stack.stop_executor("hang")
    await stack.start_daemon()
    await chaos(stack, "ok", "READ", "ok")
    async with ControlClient(stack.control_socket) as client:
        turn = (await client.call("turn.wait", turn_id=turn_id, timeout_s=30))["turn"]
    assert turn["state"] == "succeeded"
    assert turn["attempts"][0]["fault_type"] == "CRASH"


async def test_second_daemon_on_same_root_is_refused(stack: DemoStack) -> None:
    """`hunter serve` on a root that is already served exits 3 naming the running pid."""
    proc = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "supervisor",
            "serve",
            "--root",
            str(stack.root),
            "--config",
            str(stack.config_path),
        ],
        check=False,
    )
    assert proc.returncode == 3
    assert stack.daemon is not None
    assert f"pid {stack.daemon.pid}" in proc.stderr.decode()
