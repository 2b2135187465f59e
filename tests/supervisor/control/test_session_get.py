"""``session.get``: one session and its package as installed now (the console's session page),
against a real daemon; a package uninstalled since is said so, not an error."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.control.client import ControlClientError
from tests.live_daemon import Gated, demo_root, serving


@pytest.fixture
def root() -> Iterator[Path]:
    yield from demo_root("hh-session-get-")


async def test_a_session_with_its_package(root: Path) -> None:
    async with serving(root, Gated(slots=1, expected=1)) as (client, sid):
        got = await client.call("session.get", session_id=sid)
        assert got["session"]["session_id"] == sid
        assert got["session"]["package_id"] == "demo"
        assert got["package_problem"] is None
        caps = got["package"]["capabilities"]
        assert caps["network"] is False
        assert "/etc/shadow" in caps["forbidden"]
        assert got["package"]["limits"]["memory_mb"] == 64
        shutil.rmtree(root / "installed" / "demo")
        gone = await client.call("session.get", session_id=sid)
        assert gone["package"] is None
        assert "demo is not installed on this daemon's root" in gone["package_problem"]
        with pytest.raises(ControlClientError) as unknown:
            await client.call("session.get", session_id="SES-nope")
    assert unknown.value.code == "unknown_session"
