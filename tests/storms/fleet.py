"""The fleet under test: three ``hunter serve`` daemons on one PostgreSQL, each behind its proxy.

Each daemon has a root of its own (standing for a host), ``[store] engine = "postgres"`` with
its DSN pointing at its own `tests.storms.proxy.Proxy`, a short lease, the ``demo`` package and
the nemesis's own package (`nemesis_manifest`: the demo package's grants plus reading the run's
shared workspaces, so that a process turn can append to its own record there), and two no-op
SDK executors (``supervisor.examples.chaos_executor`` answering ``ok`` at once, reconnecting
after a daemon restart). The daemons' stdout and stderr go to ``<root>/daemon.log``, appended to
across restarts (`supervisor.demo.stack.DemoStack`).

`Fleet` starts them (`Fleet.start`), and offers what the nemesis does to a daemon as an operator
or the kernel would: `Member.stop` (SIGSTOP), `Member.resume` (SIGCONT), `Member.kill`
(SIGKILL) and `Member.restart` (``hunter serve`` again on the same root). `Fleet.aclose` stops
everything it started, a stopped daemon first resumed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio
import anyio.abc

from supervisor.demo.root import DEMO_CONFIG, prepare_root
from supervisor.demo.stack import DemoStack
from tests.storms.proxy import Proxy

__all__ = ["NEMESIS_PACKAGE", "Fleet", "FleetError", "Member", "nemesis_manifest"]

NEMESIS_PACKAGE: Final = "nemesis"
DAEMON_NAMES: Final = ("a", "b", "c")


class FleetError(RuntimeError):
    """Raised when a daemon, its migration or an executor does not come up; the message names
    the daemon and carries what its command said."""


def nemesis_manifest(workspaces: Path) -> str:
    """The nemesis package: the demo package's grants, plus reading *workspaces* (where the
    process turns' records are promoted: a turn reads the record so far and appends to it)."""
    return json.dumps(
        {
            "id": NEMESIS_PACKAGE,
            "version": "1.0",
            "description": "The nemesis's sessions: no-op instruction turns and small process "
            "turns that record each run in the session's shared workspace.",
            "capabilities": {
                "read": ["/usr/**", "/etc/**", f"{workspaces}/**"],
                "write": ["**"],
                "execute": ["/usr/bin/*", "/bin/*", "/usr/local/bin/*"],
                "forbidden": ["/etc/shadow", "/etc/gshadow", "/root/**"],
                "network": False,
            },
            "limits": {"memory_mb": 64, "pids": 32, "timeout_s": 30},
        },
        indent=2,
    )


def fleet_config(dsn: str, *, lease_ms: int, poll_ms: int) -> str:
    """The demo daemon's short-timeout config on the PostgreSQL store at *dsn*."""
    return DEMO_CONFIG + (
        f'\n[store]\nengine = "postgres"\ndsn = "{dsn}"\npool_size = 2\n'
        f"lease_ms = {lease_ms}\npoll_ms = {poll_ms}\n"
    )


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HUNTER_", "PG"))}
    env.pop("NOTIFY_SOCKET", None)
    return env


async def hunter(*args: str, timeout_s: float = 120.0) -> tuple[int, str]:
    """``python -m supervisor ARGS``: its exit code and its stdout and stderr together."""
    with anyio.fail_after(timeout_s):
        done = await anyio.run_process(
            [sys.executable, "-m", "supervisor", *args],
            env=_child_env(),
            check=False,
            stderr=subprocess.STDOUT,
        )
    return done.returncode, done.stdout.decode(errors="replace")


async def _migrate(root: Path, config: Path) -> None:
    """``hunter store migrate`` (once for the fleet: they share the database)."""
    code, out = await hunter("store", "migrate", "--root", str(root), "--config", str(config))
    if code != 0:
        raise FleetError(f"hunter store migrate exited {code}: {out}")


@dataclass(eq=False)
class Member:
    """One daemon of the fleet: its root, its process (`DemoStack`), its proxy, its executors."""

    name: str
    stack: DemoStack
    proxy: Proxy
    executor_ids: tuple[str, ...]
    #: every pid this member's daemon ran as, oldest first (restarts add one)
    pids: list[int] = field(default_factory=list)
    stopped: bool = False
    start_timeout_s: float = 60.0

    @property
    def root(self) -> Path:
        return self.stack.root

    @property
    def log(self) -> Path:
        return self.stack.daemon_log

    @property
    def control_socket(self) -> Path:
        return self.stack.control_socket

    @property
    def pid(self) -> int | None:
        daemon = self.stack.daemon
        return None if daemon is None or daemon.returncode is not None else daemon.pid

    @property
    def running(self) -> bool:
        return self.pid is not None

    async def start(self) -> None:
        """``hunter serve`` on this member's root; returns once it reported READY=1."""
        try:
            process = await self.stack.start_daemon(timeout_s=self.start_timeout_s)
        except RuntimeError as exc:
            raise FleetError(f"daemon {self.name} did not start: {exc}") from exc
        self.pids.append(process.pid)

    def stop(self) -> None:
        """SIGSTOP the daemon (the kernel stops every thread of it)."""
        pid = self.pid
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)
            self.stopped = True

    def resume(self) -> None:
        """SIGCONT a daemon `stop` stopped."""
        pid = self.pid
        if pid is not None and self.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.stopped = False

    async def kill(self) -> None:
        """SIGKILL the daemon and reap it (its executors stay, reconnecting)."""
        if self.stack.daemon is not None:
            self.resume()
            await self.stack.stop_daemon(signal.SIGKILL)

    async def restart(self) -> None:
        """Start the daemon again on its own root, as an operator would after a crash."""
        await self.start()

    async def aclose(self) -> None:
        """Resume it if stopped, then stop its executors and itself (SIGTERM, then SIGKILL)."""
        self.resume()
        with anyio.CancelScope(shield=True):
            await self.stack.aclose()


@dataclass(eq=False)
class Fleet:
    """Three daemons on one database, each behind its proxy (see the module docstring)."""

    base: Path
    members: dict[str, Member]

    @classmethod
    async def start(
        cls,
        base: Path,
        *,
        proxies: Sequence[Proxy],
        database: str,
        workspaces: Path,
        lease_ms: int,
        poll_ms: int = 200,
        executors: int = 2,
        start_timeout_s: float = 60.0,
    ) -> Fleet:
        """Prepare a root per proxy (``base/<name>``), migrate the schema once, start each
        daemon and its *executors* no-op executors. On failure what was started is stopped."""
        fleet = cls(base=base, members={})
        try:
            for proxy in proxies:
                root = base / proxy.name
                dsn = f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}"
                config = prepare_root(
                    root,
                    fresh=True,
                    config_text=fleet_config(dsn, lease_ms=lease_ms, poll_ms=poll_ms),
                )
                package = root / "installed" / NEMESIS_PACKAGE
                package.mkdir(parents=True, exist_ok=True)
                (package / "manifest.json").write_text(nemesis_manifest(workspaces), "utf-8")
                if not fleet.members:
                    await _migrate(root, config)
                member = Member(
                    name=proxy.name,
                    stack=DemoStack(root=root, config_path=config),
                    proxy=proxy,
                    executor_ids=tuple(f"{proxy.name}-noop-{i}" for i in range(executors)),
                    start_timeout_s=start_timeout_s,
                )
                fleet.members[proxy.name] = member
                await member.start()
                for executor_id in member.executor_ids:
                    await member.stack.start_executor(
                        executor_id,
                        [
                            "supervisor.examples.chaos_executor",
                            "--commands",
                            "READ,CLICK",
                            "--behaviour",
                            "ok",
                            "--slots",
                            "4",
                        ],
                    )
        except BaseException:
            await fleet.aclose()
            raise
        return fleet

    def __iter__(self) -> Iterator[Member]:
        return iter(self.members.values())

    @property
    def names(self) -> list[str]:
        return list(self.members)

    def member(self, name: str) -> Member:
        return self.members[name]

    def running(self) -> list[Member]:
        return [m for m in self.members.values() if m.running and not m.stopped]

    async def aclose(self) -> None:
        """Stop every daemon and executor (a stopped daemon is resumed first)."""
        with anyio.CancelScope(shield=True):
            for member in self.members.values():
                member.resume()
            for member in self.members.values():
                with contextlib.suppress(Exception):
                    await member.aclose()
