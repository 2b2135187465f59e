"""`hunter turn list`: a real daemon's turns filtered by session, state, package and time
accepted, paged, as a table and `--json`, over the real control socket."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from structlog.testing import capture_logs

from supervisor.cli import main
from supervisor.cli.turn_list_commands import parse_when
from supervisor.client import connect
from supervisor.control.client import ControlClient
from supervisor.sdk import Executor, Instruction, Result
from tests.live_daemon import WAIT_S, demo_root, serving


class ReadOrFail(Executor):
    """READ succeeds, EXTRACT fails."""

    def __init__(self) -> None:
        super().__init__(executor_id="read-or-fail")

    async def read(self, instruction: Instruction) -> Result:
        return Result.success("page")

    async def extract(self, instruction: Instruction) -> Result:
        return Result.failure("nothing matched")


@dataclass(frozen=True)
class Listed:
    """What the test submitted: the turns by name, the sessions, the socket."""

    socket: Path
    demo_sid: str
    other_sid: str
    turns: dict[str, dict[str, Any]]


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root with the demo package and a second one, `other`."""
    for path in demo_root("hh-turn-list-"):
        manifest = orjson.loads((path / "installed" / "demo" / "manifest.json").read_bytes())
        (path / "installed" / "other").mkdir()
        (path / "installed" / "other" / "manifest.json").write_bytes(
            orjson.dumps({**manifest, "id": "other"})
        )
        yield path


async def _settled(client: ControlClient, sid: str, command: str) -> dict[str, Any]:
    submitted = await client.call(
        "turn.submit",
        session_id=sid,
        kind="instruction",
        command_type=command,
        target_selector="#x",
        phase="RED",
        declared_outputs=[],
    )
    done = await client.call("turn.wait", turn_id=submitted["turn"]["turn_id"], timeout_s=WAIT_S)
    turn = dict(done["turn"])
    assert turn["final"], turn
    return turn


@asynccontextmanager
async def listing(root: Path) -> AsyncIterator[Listed]:
    """A daemon with four settled turns: two READs and an EXTRACT in a demo session, a READ
    in a session of `other` (in the test's own task: the daemon's task group is)."""
    # the daemon logs in this process: into a list, so that stdout is the command's alone
    with capture_logs():
        async with serving(root, ReadOrFail()) as (client, demo_sid):
            other_sid = (await client.call("session.open", package_id="other"))["session_id"]
            turns = {
                "read1": await _settled(client, demo_sid, "READ"),
                "extract": await _settled(client, demo_sid, "EXTRACT"),
                "read2": await _settled(client, demo_sid, "READ"),
                "other": await _settled(client, other_sid, "READ"),
            }
            yield Listed(root / "run" / "control.sock", demo_sid, other_sid, turns)


async def hunter(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`hunter ARGV` in a worker thread: exit code, stdout, stderr."""
    code = await anyio.to_thread.run_sync(functools.partial(main, list(argv)))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def listed_ids(listed: Listed, capsys: pytest.CaptureFixture[str], *flags: str) -> list[int]:
    """The turn ids `hunter turn list --json FLAGS` prints (it must say no page follows)."""
    code, out, _ = await hunter(
        capsys, "turn", "list", "--json", "--socket", str(listed.socket), *flags
    )
    assert code == 0
    answer = orjson.loads(out)
    assert answer["next_after"] is None
    return [t["turn_id"] for t in answer["turns"]]


def ids(listed: Listed, *names: str) -> list[int]:
    return [listed.turns[name]["turn_id"] for name in names]


async def test_filters(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each filter keeps exactly the turns it names, and given together they all hold."""
    async with listing(root) as listed:
        everything = ids(listed, "read1", "extract", "read2", "other")
        assert await listed_ids(listed, capsys) == everything
        assert await listed_ids(listed, capsys, "--session", listed.other_sid) == ids(
            listed, "other"
        )
        assert await listed_ids(listed, capsys, "--package", "other") == ids(listed, "other")
        assert await listed_ids(listed, capsys, "--package", "demo") == everything[:3]
        failed_state = listed.turns["extract"]["state"]
        assert failed_state != "succeeded"
        assert await listed_ids(listed, capsys, "--state", failed_state) == ids(listed, "extract")
        assert await listed_ids(
            listed, capsys, "--state", f"succeeded,{failed_state}", "--package", "demo"
        ) == ids(listed, "read1", "extract", "read2")
        assert await listed_ids(
            listed, capsys, "--state", "succeeded", "--session", listed.demo_sid
        ) == ids(listed, "read1", "read2")


async def test_time_window(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--since keeps turns accepted at or after a time, --until those before it; ISO times and
    ages both work."""
    async with listing(root) as listed:
        cut_us = listed.turns["read2"]["accepted_us"]
        cut = datetime.fromtimestamp(cut_us / 1_000_000, tz=UTC).isoformat()
        accepted = {name: t["accepted_us"] for name, t in listed.turns.items()}
        later = [listed.turns[n]["turn_id"] for n in listed.turns if accepted[n] >= cut_us]
        earlier = [listed.turns[n]["turn_id"] for n in listed.turns if accepted[n] < cut_us]
        assert ids(listed, "read2") == later[:1]
        assert await listed_ids(listed, capsys, "--since", cut) == later
        assert await listed_ids(listed, capsys, "--until", cut) == earlier
        assert ids(listed, "read1") == earlier[:1]
        assert len(await listed_ids(listed, capsys, "--since", "1d")) == 4
        assert await listed_ids(listed, capsys, "--until", "1d") == []


async def test_pages_and_table(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--limit prints that many and stderr names the --after of the next page, which gives the
    rest; the table has a row per turn with its state."""
    async with listing(root) as listed:
        sock = str(listed.socket)
        code, out, err = await hunter(capsys, "turn", "list", "--socket", sock, "--limit", "3")
        assert code == 0
        lines = out.splitlines()
        assert lines[0].split() == [
            "TURN", "SESSION", "NO", "KIND", "STATE", "ATTEMPT", "ACCEPTED", "REASON"
        ]  # fmt: skip
        rows = [line.split() for line in lines[2:]]
        assert [int(r[0]) for r in rows] == ids(listed, "read1", "extract", "read2")
        assert rows[0][4] == "succeeded"
        assert rows[1][4] == listed.turns["extract"]["state"]
        after = listed.turns["read2"]["turn_id"]
        assert f"--after {after}" in err
        code, out, err = await hunter(
            capsys, "turn", "list", "--socket", sock, "--after", str(after)
        )
        assert code == 0
        assert [int(line.split()[0]) for line in out.splitlines()[2:]] == ids(listed, "other")
        assert err == ""


async def test_client_library_filters(root: Path) -> None:
    """The client library's `turns` takes the same filters as typed arguments."""
    async with listing(root) as listed, connect(socket=listed.socket) as client:
        turns = [t.turn_id async for t in client.turns(package_id="demo", states=["succeeded"])]
        assert turns == ids(listed, "read1", "read2")
        since = datetime.fromtimestamp(listed.turns["read2"]["accepted_us"] / 1e6, tz=UTC)
        page = await client.turn_page(accepted_since=since, limit=1)
        assert [t.turn_id for t in page.turns] == ids(listed, "read2")
        assert page.next_after == ids(listed, "read2")[0]


def test_bad_filters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown state or an unreadable time is a usage error naming what is wanted (before
    any daemon is asked)."""
    sock = str(tmp_path / "none.sock")
    for flags, wanted in (
        (["--state", "done"], "a turn state is one of accepted, running"),
        (["--since", "soon"], "neither an ISO 8601 time"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(["turn", "list", "--socket", sock, *flags])
        assert exited.value.code == 2
        assert wanted in capsys.readouterr().err


def test_parse_when_ages() -> None:
    """An age is that long before now; an ISO time is itself."""
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    assert parse_when("90s", now=now) == datetime(2026, 11, 26, 11, 58, 30, tzinfo=UTC)
    assert parse_when("2h", now=now) == datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    assert parse_when("7d", now=now) == datetime(2026, 11, 19, 12, 0, tzinfo=UTC)
    assert parse_when("2026-11-26T14:30+00:00") == datetime(2026, 11, 26, 14, 30, tzinfo=UTC)
