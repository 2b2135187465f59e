"""End to end: a real `hunter serve` process with `[metrics]` on, real executor processes, real
process turns, scraped over its Unix socket and read back from its textfile, every exposition
parsed with prometheus-client's own parser."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.control.client import ControlClient, ControlClientError
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root other users can traverse (process turns run under their own uid)."""
    path = Path(tempfile.mkdtemp(prefix="hh-metrics-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def stack(root: Path) -> AsyncIterator[DemoStack]:
    """A daemon serving metrics on <root>/run/metrics.sock and writing <root>/hunter.prom."""
    config = DEMO_CONFIG + (
        f'\n[metrics]\nlisten = "{root}/run/metrics.sock"\n'
        f'textfile = "{root}/hunter.prom"\ntextfile_interval_s = 3600\n'
    )
    s = DemoStack(root=root, config_path=prepare_root(root, fresh=True, config_text=config))
    try:
        await s.start_daemon()
        yield s
    finally:
        await s.aclose()


def _samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(path: Path) -> Samples:
    async with await anyio.connect_unix(path) as stream:
        await stream.send(b"GET /metrics HTTP/1.0\r\n\r\n")
        data = b""
        with contextlib.suppress(anyio.EndOfStream):
            while True:
                data += await stream.receive()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK"), head
    return _samples(body.decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


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


async def run(client: ControlClient, sid: str, **params: Any) -> dict[str, Any]:
    params.setdefault("declared_outputs", [])
    submitted = await client.call("turn.submit", session_id=sid, **params)
    result = await client.call("turn.wait", turn_id=submitted["turn"]["turn_id"], timeout_s=30)
    return dict(result["turn"])


async def test_a_daemons_work_shows_in_its_metrics(stack: DemoStack) -> None:
    """Retries, faults, a quarantine, a sandbox violation, an intake refusal, a
    resource-exhausted escalation and a ledger verification each move their metric."""
    metrics_socket = stack.root / "run" / "metrics.sock"
    before = await scrape(metrics_socket)
    assert value(before, "hunter_turns_accepted_total") == 0
    assert value(before, "hunter_escalations_total", fault_type="RESOURCE_EXHAUSTED") == 0
    # the textfile was written at start, before READY=1
    assert value(_samples((stack.root / "hunter.prom").read_text("utf-8")), "hunter_draining") == 0

    await chaos(stack, "flaky", "READ", "error,ok")
    await chaos(stack, "rogue", "SCREENSHOT", "authority")
    async with ControlClient(stack.control_socket) as client:
        sid = str((await client.call("session.open", package_id="demo"))["session_id"])
        read = await run(client, sid, kind="instruction", command_type="READ", target_selector="h1")
        rogue = await run(client, sid, kind="instruction", command_type="SCREENSHOT")
        sneaky = await run(
            client, sid, kind="process", argv=["sh", "-c", 'echo x > "$HUNTER_OUTPUT_DIR/x"']
        )
        with pytest.raises(ControlClientError, match=r"capability_violation"):
            await client.call(
                "turn.submit",
                session_id=sid,
                kind="process",
                argv=["/usr/sbin/nologin"],
                declared_outputs=[],
            )
        hog = await run(
            client, sid, kind="process", argv=["python3", "-c", "b = bytearray(512 << 20)"]
        )
        assert (read["state"], rogue["state"], sneaky["state"], hog["state"]) == (
            "succeeded",
            "violation",
            "violation",
            "escalated",
        )
        verified = await client.call("ledger.verify", session_id=sid)
        assert verified["ok"]
        after = await scrape(metrics_socket)
        await client.call(
            "escalations.resolve", turn_id=hog["turn_id"], action="terminate", reason="a hog"
        )
        resolved = await scrape(metrics_socket)

    # turns: four accepted, three ended (the hog waits for an operator), by kind and state
    assert value(after, "hunter_turns_accepted_total") == 4
    duration = "hunter_turn_duration_seconds_count"
    assert value(after, duration, kind="instruction", state="succeeded") == 1
    assert value(after, duration, kind="instruction", state="violation") == 1
    assert value(after, duration, kind="process", state="violation") == 1
    assert value(after, duration, kind="process", state="terminated") == 0
    assert value(resolved, duration, kind="process", state="terminated") == 1
    # attempts, retries and faults by fault type and decision
    assert value(after, "hunter_attempts_total", outcome="FAULT", decision="RETRY") == 1
    assert value(after, "hunter_attempts_total", outcome="SUCCESS", decision="SUCCEED") == 1
    assert value(after, "hunter_retries_total", fault_type="CRASH") == 1
    assert value(after, "hunter_faults_total", fault_type="CRASH", decision="RETRY") == 1
    # the rogue executor's authority claim and the undeclared write are both security faults
    assert (
        value(after, "hunter_faults_total", fault_type="SECURITY_VIOLATION", decision="TERMINATE")
        == 2
    )
    assert (
        value(after, "hunter_faults_total", fault_type="RESOURCE_EXHAUSTED", decision="ESCALATE")
        == 1
    )
    assert value(after, "hunter_escalations_total", fault_type="RESOURCE_EXHAUSTED") == 1
    # the sandbox: the undeclared write after the run, and the command refused at intake
    violations = {
        dict(labels)["capability"]: v
        for (name, labels), v in after.items()
        if name == "hunter_sandbox_violations_total"
    }
    assert violations.get("capabilities.execute") == 1, violations
    assert sum(violations.values()) == 2, violations
    # executors: the rogue is quarantined, the flaky one is ready; nothing is queued
    assert value(after, "hunter_executors_quarantined") == 1
    assert value(after, "hunter_executors", status="READY") == 1
    assert value(after, "hunter_turns_queued") == 0
    assert value(after, "hunter_queue_depth", command_type="READ") == 0
    # ledgers: two lines per ending (three ended, one escalated), durable syncs, one session
    # verified clean
    assert value(after, "hunter_ledger_appends_total", ledger="exec") == 4
    assert value(after, "hunter_ledger_appends_total", ledger="evidence") == 4
    assert value(after, "hunter_ledger_sync_seconds_count") >= 1
    assert value(after, "hunter_ledger_verifications_total") == 2
    assert value(after, "hunter_ledger_verify_failures_total") == 0
    assert value(after, "hunter_store_commits_total", engine="sqlite") > 0
