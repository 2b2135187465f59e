"""Who decided (issue 21): `escalations.resolve`, `turn.cancel` and `drain` are attributed to
the caller's uid (the control socket's peer credentials, read by the daemon), an operator name
and a reason, in the evidence ledger entry, `turn.get`, `hunter turn show` and the log.

A real in-process daemon on a fresh root, reached through its real control socket (by a
`ControlClient`, and by the `hunter` commands), so the peer is this very process: its uid and
pid are what the daemon must record. A turn is escalated as in the end-to-end tests: a process
turn over the demo package's memory limit (RESOURCE_EXHAUSTED escalates).
"""

from __future__ import annotations

import functools
import io
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from ledger import verify_root
from supervisor.cli import main
from supervisor.config import load_config
from supervisor.control.client import ControlClient, ControlClientError
from supervisor.demo.stack import prepare_root
from supervisor.logging import configure_logging, reset_logging
from supervisor.server import Daemon
from supervisor.turns.decisions import operator_name

_HOG = ["python3", "-c", "b = bytearray(512 << 20)"]  # over the demo package's memory limit


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root others can traverse (process turns run under their own uid), with the demo
    package installed; every ledger under it must verify at the end."""
    base = Path(tempfile.mkdtemp(prefix="hh-dec-"))
    base.chmod(0o711)
    prepare_root(base / "r", fresh=True)
    try:
        yield base / "r"
        report = verify_root(base / "r", workers=1)
        assert report.ok, report.errors
    finally:
        shutil.rmtree(base, ignore_errors=True)


@asynccontextmanager
async def serving(root: Path, log: io.StringIO) -> AsyncIterator[Daemon]:
    """An in-process daemon on *root*, its JSON log lines written to *log*."""
    configure_logging(fmt="json", stream=log)
    daemon = Daemon(load_config(None, env={}, overrides={"root": root}), handle_signals=False)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            try:
                yield daemon
            finally:
                daemon.request_drain()
    finally:
        reset_logging()


def events(log: io.StringIO, name: str) -> list[dict[str, Any]]:
    found = [orjson.loads(line) for line in log.getvalue().splitlines() if line.startswith("{")]
    return [e for e in found if e.get("event") == name]


async def hunter(*argv: str) -> int:
    """Run `hunter ARGV` in a worker thread (it starts its own event loop)."""
    return await anyio.to_thread.run_sync(functools.partial(main, list(argv)))


async def escalated_turn(client: ControlClient, sid: str) -> int:
    submitted = await client.call(
        "turn.submit", session_id=sid, kind="process", argv=_HOG, declared_outputs=[], wait_s=30
    )
    assert submitted["turn"]["state"] == "escalated", submitted["turn"]
    return int(submitted["turn"]["turn_id"])


def evidence_entry(got: dict[str, Any]) -> dict[str, Any]:
    """The turn's last evidence entry as `turn.get` shows it."""
    entries = got["ledger"]["evidence"]
    assert entries, got["ledger"]
    return dict(entries[-1])


async def test_resolve_needs_a_reason_and_records_who_decided(root: Path) -> None:
    """Without a reason the decision is refused, naming `reason`, and nothing changes; with one
    the turn ends with `decided_by` {uid, pid, operator, reason, at_us} in its result, in its
    evidence ledger entry and in the `escalation_resolved` event; the uid and pid are the
    caller's as the kernel gave them, whatever the client sends."""
    log = io.StringIO()
    async with serving(root, log), ControlClient(root / "run" / "control.sock") as client:
        sid = str((await client.call("session.open", package_id="demo"))["session_id"])
        turn_id = await escalated_turn(client, sid)
        with pytest.raises(ControlClientError) as refused:
            await client.call("escalations.resolve", turn_id=turn_id, action="terminate")
        assert refused.value.code == "bad_request"
        assert refused.value.details["field"] == "reason"
        assert refused.value.message.startswith("reason: is required")
        with pytest.raises(ControlClientError) as blank:
            await client.call(
                "escalations.resolve", turn_id=turn_id, action="terminate", reason="   "
            )
        assert blank.value.details["field"] == "reason"
        assert (await client.call("turn.get", turn_id=turn_id))["turn"]["state"] == "escalated"

        done = await client.call(
            "escalations.resolve",
            turn_id=turn_id,
            action="terminate",
            reason="asks for 512 MiB; the package allows less",
            uid=0,  # not a parameter: the uid is the kernel's
        )
        got = await client.call("turn.get", turn_id=turn_id)
    assert done["turn"]["state"] == "terminated"
    decided = got["turn"]["result"]["decided_by"]
    assert decided == done["turn"]["result"]["decided_by"]
    assert decided["action"] == "terminate"
    assert (decided["uid"], decided["pid"]) == (os.getuid(), os.getpid())
    assert decided["operator"] == operator_name(os.getuid())
    assert decided["reason"] == "asks for 512 MiB; the package allows less"
    assert isinstance(decided["at_us"], int)
    assert evidence_entry(got)["decided_by"] == decided
    (event,) = events(log, "escalation_resolved")
    assert (event["uid"], event["operator"], event["reason"]) == (
        os.getuid(),
        decided["operator"],
        decided["reason"],
    )


async def test_a_retry_is_attributed_until_the_turn_ends_again(root: Path) -> None:
    """A retry's decision is in the turn's result while it runs again (no ending, so no ledger
    entry of its own), with the operator the client named, and in the log event."""
    log = io.StringIO()
    async with serving(root, log), ControlClient(root / "run" / "control.sock") as client:
        sid = str((await client.call("session.open", package_id="demo"))["session_id"])
        turn_id = await escalated_turn(client, sid)
        retried = await client.call(
            "escalations.resolve",
            turn_id=turn_id,
            action="retry",
            reason="memory freed on the host",
            operator="Ann Operator",
        )
    decided = retried["turn"]["result"]["decided_by"]
    assert (decided["action"], decided["operator"]) == ("retry", "Ann Operator")
    assert (decided["uid"], decided["reason"]) == (os.getuid(), "memory freed on the host")
    (event,) = events(log, "escalation_resolved")
    assert (event["action"], event["operator"]) == ("retry", "Ann Operator")


async def test_a_cancel_with_a_reason_is_recorded(root: Path) -> None:
    """`turn.cancel` of a running turn with a reason: the cancelled turn's result and evidence
    entry name who cancelled and why; a cancel of an escalated turn too; without a reason the
    cancel still goes through (programs cancel their own turns), recording the uid."""
    log = io.StringIO()
    async with serving(root, log), ControlClient(root / "run" / "control.sock") as client:
        sid = str((await client.call("session.open", package_id="demo"))["session_id"])
        running = await client.call(
            "turn.submit",
            session_id=sid,
            kind="process",
            argv=["sleep", "30"],
            declared_outputs=[],
        )
        turn_id = running["turn"]["turn_id"]
        await client.call("turn.wait", turn_id=turn_id, until=["running"], timeout_s=10)
        cancelled = await client.call(
            "turn.cancel", turn_id=turn_id, reason="wrong workspace", operator="bob"
        )
        got = await client.call("turn.get", turn_id=turn_id)
        parked = await escalated_turn(client, sid)
        plain = await client.call("turn.cancel", turn_id=parked)
        plain_got = await client.call("turn.get", turn_id=parked)
    assert cancelled["turn"]["state"] == "cancelled"
    decided = got["turn"]["result"]["decided_by"]
    assert (decided["action"], decided["operator"], decided["reason"]) == (
        "cancel",
        "bob",
        "wrong workspace",
    )
    assert (decided["uid"], decided["pid"]) == (os.getuid(), os.getpid())
    assert evidence_entry(got)["decided_by"] == decided
    assert plain["turn"]["state"] == "cancelled"
    unexplained = plain_got["turn"]["result"]["decided_by"]
    assert (unexplained["uid"], unexplained["reason"]) == (os.getuid(), None)
    assert evidence_entry(plain_got)["decided_by"] == unexplained
    asked = events(log, "turn_cancel_requested")
    assert [(e["turn_id"], e["uid"], e["operator"], e["reason"]) for e in asked] == [
        (turn_id, os.getuid(), "bob", "wrong workspace"),
        (parked, os.getuid(), operator_name(os.getuid()), None),
    ]


async def test_the_cli_passes_reason_and_operator(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hunter escalations resolve N --terminate` needs `--reason` (argparse refuses, exit 2);
    with `--reason` and `--operator` both reach the record, which `hunter turn show` prints on
    its `decided:` line; `hunter drain --reason` is logged with the caller's uid."""
    r = str(root)
    log = io.StringIO()
    async with serving(root, log), ControlClient(root / "run" / "control.sock") as client:
        sid = str((await client.call("session.open", package_id="demo"))["session_id"])
        turn_id = str(await escalated_turn(client, sid))
        with pytest.raises(SystemExit) as usage:
            await hunter("escalations", "resolve", turn_id, "--terminate", "--root", r)
        assert usage.value.code == 2
        assert "--reason" in capsys.readouterr().err
        code = await hunter(
            "escalations", "resolve", turn_id, "--terminate", "--root", r,
            "--reason", "runaway allocation", "--operator", "carol",
        )  # fmt: skip
        assert code == 0
        assert capsys.readouterr().out.strip() == f"turn {turn_id}: terminated"
        assert await hunter("turn", "show", turn_id, "--root", r) == 0
        shown = capsys.readouterr().out
        (line,) = [x for x in shown.splitlines() if x.strip().startswith("decided:")]
        assert f"terminate by carol (uid {os.getuid()}) at " in line
        assert line.endswith(": runaway allocation")
        got = await client.call("turn.get", turn_id=int(turn_id))
        assert evidence_entry(got)["decided_by"]["operator"] == "carol"
        assert await hunter("drain", "--root", r, "--reason", "kernel update") == 0
        assert capsys.readouterr().out.strip() == "drain started"
    (drain,) = events(log, "drain_requested")
    assert (drain["uid"], drain["pid"]) == (os.getuid(), os.getpid())
    assert (drain["operator"], drain["reason"]) == (operator_name(os.getuid()), "kernel update")
