"""End to end, retry storms and the "no executor" wait: a real `hunter serve`, real executors.

Synchronisation is by what the daemon reports (`turn.wait`, `executors.wait`), never by
sleeping. The configs here use the production queue wait (60 s), so a turn that waits for it
would make `turn.wait` time out: the bounds are what the tests check.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import verify_root
from supervisor.cli.daemon_commands import format_status
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root
from tests.supervisor.test_metrics_e2e import scrape, value

pytestmark = pytest.mark.slow

#: The production queue wait: an attempt that waited it would outlast every `turn.wait` here.
SLOW_QUEUE_CONFIG = DEMO_CONFIG.replace("queue_wait_s = 3.0", "queue_wait_s = 60.0")


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hh-storm-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def daemon(root: Path, config_text: str = SLOW_QUEUE_CONFIG) -> AsyncIterator[DemoStack]:
    """A running daemon on a fresh root; its ledgers are verified when the test is done."""
    config = prepare_root(root, fresh=True, config_text=config_text)
    s = DemoStack(root=root, config_path=config)
    try:
        await s.start_daemon()
        yield s
    finally:
        await s.aclose()
    report = verify_root(root, workers=1)
    assert report.ok, report.errors


@pytest.fixture
async def stack(root: Path) -> AsyncIterator[DemoStack]:
    """A running daemon with the production queue wait."""
    async with daemon(root) as s:
        yield s


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


async def submit(client: ControlClient, sid: str, **params: Any) -> int:
    params.setdefault("declared_outputs", [])
    params.setdefault("kind", "instruction")
    submitted = await client.call("turn.submit", session_id=sid, **params)
    return int(submitted["turn"]["turn_id"])


async def wait(client: ControlClient, turn_id: int, timeout_s: float = 20) -> dict[str, Any]:
    result = await client.call("turn.wait", turn_id=turn_id, timeout_s=timeout_s)
    turn = dict(result["turn"])
    assert turn["state"] not in {"accepted", "running", "waiting_retry"}, turn
    return turn


async def test_no_capable_executor_ends_within_the_turns_timeout(stack: DemoStack) -> None:
    """A one-second instruction nobody serves ends after about a second, once, with its own
    reason code, not after three 60 s queue waits as an executor TIMEOUT."""
    async with ControlClient(stack.control_socket) as client:
        sid = await session(client)
        turn_id = await submit(client, sid, command_type="SCROLL", timeout_ms=1000, phase="GREEN")
        turn = await wait(client, turn_id, timeout_s=20)
    assert turn["state"] == "terminated"
    assert turn["reason_code"] == "NO_CAPABLE_EXECUTOR"
    assert turn["fault_type"] is None
    (attempt,) = turn["attempts"]
    assert attempt["outcome"] == "NO_EXECUTOR"
    assert attempt["decision"] == "TERMINATE"
    assert (turn["finished_us"] - turn["accepted_us"]) < 10_000_000


async def test_busy_capable_executor_waits_at_most_the_timeout(stack: DemoStack) -> None:
    """With a capable executor whose only slot is taken, a one-second instruction waits for a
    slot at most a second per attempt (then the usual TIMEOUT policy), not 60 s."""
    await chaos(stack, "busy", "SCROLL", "hang")
    async with ControlClient(stack.control_socket) as client:
        sid = await session(client)
        hog = await submit(client, sid, command_type="SCROLL", timeout_ms=60_000)
        await client.call("turn.wait", turn_id=hog, until=["running"], timeout_s=20)
        turn_id = await submit(client, sid, command_type="SCROLL", timeout_ms=1000)
        turn = await wait(client, turn_id, timeout_s=25)
        await client.call("turn.cancel", turn_id=hog)
    assert turn["state"] == "timeout"
    assert [a["fault_type"] for a in turn["attempts"]] == ["TIMEOUT"] * 3
    assert all("QUEUE_WAIT_EXPIRED" in (a["detail"] or "") for a in turn["attempts"])
    # bounded by the instruction's own timeout (1 s), below executors.queue_wait_s
    assert all(
        "limit 1s: the instruction's timeout_ms" in (a["detail"] or "") for a in turn["attempts"]
    )


async def retry_after_executor(
    s: DemoStack, executor_id: str, *, answer: str, retry_after_ms: int, command: str = "READ"
) -> None:
    await s.start_executor(
        executor_id,
        [
            "tests.supervisor.retry_after_executor",
            "--command",
            command,
            "--answer",
            answer,
            "--retry-after-ms",
            str(retry_after_ms),
        ],
    )


RETRY_AFTER_CONFIG = DEMO_CONFIG.replace("max_delay_ms = 200", "max_delay_ms = 5000")


async def test_executor_retry_after_is_the_wait_before_the_retry(root: Path) -> None:
    """An ERROR answer with retry_after_ms=1500 makes the daemon wait 1.5 s (not its 50 ms
    backoff) before the retry, which then succeeds."""
    async with daemon(root, RETRY_AFTER_CONFIG) as s:
        await retry_after_executor(s, "polite", answer="error", retry_after_ms=1500)
        async with ControlClient(s.control_socket) as client:
            sid = await session(client)
            turn = await wait(
                client, await submit(client, sid, command_type="READ", target_selector="h1")
            )
    assert turn["state"] == "succeeded"
    first, second = turn["attempts"]
    assert (first["fault_type"], first["decision"], first["delay_ms"]) == ("CRASH", "RETRY", 1500)
    assert second["started_us"] - first["finished_us"] >= 1_400_000


async def test_executor_retry_after_is_capped_by_max_delay(root: Path) -> None:
    """A FAILURE in GREEN asking for a minute waits only `[retry] max_delay_ms` (200 ms here)."""
    async with daemon(root, DEMO_CONFIG) as s:
        await retry_after_executor(s, "greedy", answer="failure", retry_after_ms=60_000)
        async with ControlClient(s.control_socket) as client:
            sid = await session(client)
            turn_id = await submit(
                client, sid, command_type="READ", target_selector="h1", phase="GREEN"
            )
            turn = await wait(client, turn_id)
    assert turn["state"] == "succeeded"
    first, _ = turn["attempts"]
    assert (first["outcome"], first["reason_code"], first["delay_ms"]) == (
        "FAILURE",
        "PERSISTENT_FAILURE_RETRY",
        200,
    )


#: A budget of one retry per minute, whatever the traffic (ratio 0).
TIGHT_BUDGET_CONFIG = DEMO_CONFIG.replace(
    "max_delay_ms = 200",
    "max_delay_ms = 200\nbudget_ratio = 0.0\nbudget_window_s = 60.0\nbudget_min_retries = 1",
)


async def test_retry_budget_is_daemon_wide(root: Path) -> None:
    """With one retry allowed per window, the first failing turn gets its one retry and then
    ends DAEMON_RETRY_BUDGET_EXHAUSTED; the next failing turn gets none; `hunter status` shows
    the spent budget. Turns that succeed at once are unaffected."""
    async with daemon(root, TIGHT_BUDGET_CONFIG) as s:
        await chaos(s, "broken", "CLICK", "error")
        await chaos(s, "fine", "READ", "ok")
        async with ControlClient(s.control_socket) as client:
            sid = await session(client)
            first = await wait(
                client, await submit(client, sid, command_type="CLICK", target_selector="#a")
            )
            second = await wait(
                client, await submit(client, sid, command_type="CLICK", target_selector="#b")
            )
            fine = await wait(
                client, await submit(client, sid, command_type="READ", target_selector="h1")
            )
            status = await client.call("status")
    assert [(a["fault_type"], a["decision"]) for a in first["attempts"]] == [
        ("CRASH", "RETRY"),
        ("CRASH", "TERMINATE"),
    ]
    assert first["reason_code"] == "DAEMON_RETRY_BUDGET_EXHAUSTED"
    assert first["state"] == "terminated"
    assert [(a["fault_type"], a["decision"]) for a in second["attempts"]] == [
        ("CRASH", "TERMINATE")
    ]
    assert second["reason_code"] == "DAEMON_RETRY_BUDGET_EXHAUSTED"
    assert fine["state"] == "succeeded"
    budget = status["retry_budget"]
    assert (budget["retries"], budget["allowance"], budget["refused_total"]) == (1, 1, 2)
    assert budget["first_attempts"] == 3
    assert "retry budget: 1 of 1 retries used in the window (3 first attempts); refused 2" in (
        format_status(status)
    )
    refused = [e for e in log_events(s) if e.get("event") == "retry_refused"]
    assert [(e["would_be"], e["retries"], e["allowance"]) for e in refused] == [
        ("RETRY_AFTER_CRASH", 1, 1),
        ("RETRY_AFTER_CRASH", 1, 1),
    ]


#: Breakers open after two faults in a minute and probe after two seconds.
BREAKER_CONFIG = DEMO_CONFIG.replace(
    "hello_timeout_s = 2.0",
    "hello_timeout_s = 2.0\nbreaker_faults = 2\nbreaker_window_s = 60.0\nbreaker_cooldown_s = 2.0",
)


def log_events(s: DemoStack) -> list[dict[str, Any]]:
    events = []
    for line in s.daemon_log.read_text(encoding="utf-8", errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)
    return events


async def test_circuit_breaker_opens_fails_fast_and_closes_on_a_probe(root: Path) -> None:
    """Two CRASH faults of the CLICK pool open its breaker: the third attempt and the next
    turn fail fast (CIRCUIT_OPEN, no executor reached) while READ flows; status, the metric
    and the log show it; after the cool-down one probe goes, succeeds, and the breaker closes."""
    metrics = f'\n[metrics]\nlisten = "{root}/run/metrics.sock"\n'
    async with daemon(root, BREAKER_CONFIG + metrics) as s:
        await chaos(s, "flaky", "CLICK", "error,error,ok")
        await chaos(s, "fine", "READ", "ok")
        async with ControlClient(s.control_socket) as client:
            sid = await session(client)
            first = await wait(
                client, await submit(client, sid, command_type="CLICK", target_selector="#a")
            )
            second = await wait(
                client, await submit(client, sid, command_type="CLICK", target_selector="#b")
            )
            other_pool = await wait(
                client, await submit(client, sid, command_type="READ", target_selector="h1")
            )
            status = await client.call("status")
            circuit = status["hub"]["circuits"]["CLICK"]
            assert circuit["state"] == "open"
            assert "CIRCUIT OPEN CLICK: fails fast" in format_status(status)
            samples = await scrape(root / "run" / "metrics.sock")
            assert value(samples, "hunter_circuit_state", command_type="CLICK") == 2
            assert value(samples, "hunter_circuit_state", command_type="READ") == 0
            # the cool-down is the behaviour under test: wait what the daemon says is left
            await anyio.sleep(circuit["probe_in_ms"] / 1000 + 0.05)
            probe = await wait(
                client, await submit(client, sid, command_type="CLICK", target_selector="#c")
            )
            after = await client.call("status")
            closed = await scrape(root / "run" / "metrics.sock")
        assert value(closed, "hunter_circuit_state", command_type="CLICK") == 0
    assert [(a["outcome"], a["decision"]) for a in first["attempts"]] == [
        ("FAULT", "RETRY"),
        ("FAULT", "RETRY"),
        ("CIRCUIT_OPEN", "TERMINATE"),
    ]
    assert first["reason_code"] == "CIRCUIT_OPEN"
    (fast,) = second["attempts"]
    assert (fast["outcome"], fast["executor_id"]) == ("CIRCUIT_OPEN", None)
    assert second["reason_code"] == "CIRCUIT_OPEN"
    assert other_pool["state"] == "succeeded"
    assert probe["state"] == "succeeded"
    assert probe["attempts"][0]["executor_id"] == "flaky"
    assert "CLICK" not in after["hub"]["circuits"]
    moves = [
        (e["event"], e.get("previous"))
        for e in log_events(s)
        if e.get("event", "").startswith("circuit_") and e.get("command_type") == "CLICK"
    ]
    assert moves == [
        ("circuit_opened", "closed"),
        ("circuit_half_open", "open"),
        ("circuit_closed", "half_open"),
    ]
