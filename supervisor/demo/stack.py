"""`hunter demo`: the whole product in well under a minute, checked end to end.

What it does
------------
1. Prepares a fresh root (default: a new temporary directory, mode 0711 so that process
   turns, which run under their own uid, can reach it; removed afterwards unless ``--keep``;
   ``--root DIR`` picks a directory instead, ``--fresh`` empties it first) with a small
   config (short heartbeats, timeouts and backoff) and installs the
   example package ``demo`` (``examples/packages/demo/manifest.json``; a built-in copy is used
   when the source tree is not at hand).
2. Starts a real daemon (``python -m supervisor serve``) and waits for its ``READY=1`` on a
   private ``NOTIFY_SOCKET``, exactly as systemd would.
3. Starts the working web executor (which also serves the demo pages on loopback) and opens a
   session of the package.
4. Submits a mixed batch: every command type to the web executor; process turns that succeed,
   fail, fail in GREEN until the budget is exhausted, time out, write an undeclared file, and
   exhaust their memory limit (escalated, then terminated by the demo acting as the operator).
   Then the web executor stops and chaos executors take over: one that errors then recovers,
   one that crashes (its retry goes to another executor), one that hangs, one that lies about
   the instruction id, one that claims authority (quarantined), one with partial output, one
   that refuses, one that answers SUCCESS without evidence.
5. Prints a table (each turn, its attempts, fault, decision and reason), verifies every ledger
   through the daemon, drains the daemon with SIGTERM and stops every process it started.

Exit code 0 only if every outcome equals the expected one and every ledger verifies.
`DemoStack` (daemon + executors as real processes) is also what the end-to-end tests use.

This module holds `DemoStack` and the run (`run_demo`, `demo_main`); the root it prepares is
`supervisor.demo.root`, the batch of expected outcomes `supervisor.demo.batch`, the checking and
the table `supervisor.demo.results`. Their public names are re-exported here.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from supervisor.control.client import ControlClient, socket_for_root
from supervisor.demo.batch import (
    CHAOS_ROUND,
    CHAOS_ROUND_2,
    Expectation,
    chaos_batch,
    chaos_batch_2,
    process_batch,
    web_batch,
)
from supervisor.demo.results import DemoResult, format_results
from supervisor.demo.results import check_result as _check
from supervisor.demo.root import DEMO_CONFIG, DEMO_MANIFEST, prepare_root

__all__ = [
    "DEMO_CONFIG",
    "DEMO_MANIFEST",
    "DemoStack",
    "Expectation",
    "prepare_root",
    "run_demo",
]


class StartError(RuntimeError):
    """Raised when the daemon or an executor does not come up; the message has its log tail."""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class DemoStack:
    """A real daemon process plus real executor processes on one root (demo and e2e tests)."""

    root: Path
    config_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    daemon: anyio.abc.Process | None = None
    executors: dict[str, anyio.abc.Process] = field(default_factory=dict)
    page_base_url: str = ""
    #: wraps the daemon's command line (tests run it as an unprivileged user this way)
    daemon_wrapper: Callable[[list[str]], list[str]] | None = None
    _logs: list[Any] = field(default_factory=list)

    @property
    def control_socket(self) -> Path:
        return socket_for_root(self.root)

    @property
    def executor_socket(self) -> Path:
        return self.root / "run" / "executors.sock"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    def _child_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HUNTER_", "LISTEN_"))}
        env.pop("NOTIFY_SOCKET", None)
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def start_daemon(self, *, timeout_s: float = 20.0) -> anyio.abc.Process:
        """Start ``hunter serve`` and wait for READY=1 on a private NOTIFY_SOCKET."""
        name = f"hunter-notify-{secrets.token_hex(8)}"
        notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            notify_sock.bind("\0" + name)
            notify_sock.setblocking(False)
            env = self._child_env()
            env["NOTIFY_SOCKET"] = "@" + name
            log = self.daemon_log.open("ab")
            try:
                argv = [
                    sys.executable,
                    "-m",
                    "supervisor",
                    "serve",
                    "--root",
                    str(self.root),
                    "--config",
                    str(self.config_path),
                    "--log-format",
                    "json",
                ]
                self.daemon = await anyio.open_process(
                    self.daemon_wrapper(argv) if self.daemon_wrapper is not None else argv,
                    stdin=None,
                    stdout=log,
                    stderr=log,
                    env=env,
                    start_new_session=True,
                )
            finally:
                log.close()
            daemon = self.daemon
            with anyio.move_on_after(timeout_s) as scope:
                async with anyio.create_task_group() as tg:

                    async def exited() -> None:
                        await daemon.wait()
                        tg.cancel_scope.cancel()

                    tg.start_soon(exited)
                    while True:
                        await anyio.wait_readable(notify_sock)
                        data = notify_sock.recv(4096).decode(errors="replace")
                        if "READY=1" in data.splitlines():
                            tg.cancel_scope.cancel()
                            return daemon
        finally:
            notify_sock.close()
        why = "did not report READY=1" if scope.cancelled_caught else "exited"
        raise StartError(
            f"the daemon {why} (exit {daemon.returncode}); log {self.daemon_log}:\n"
            + _tail(self.daemon_log)
        )

    async def stop_daemon(
        self, sig: signal.Signals = signal.SIGTERM, *, timeout_s: float = 15.0
    ) -> int:
        """Send *sig* to the daemon and wait for it to exit; returns its exit code."""
        daemon = self.daemon
        assert daemon is not None
        if daemon.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                daemon.send_signal(sig)
            with anyio.move_on_after(timeout_s):
                await daemon.wait()
            if daemon.returncode is None:
                daemon.kill()
                await daemon.wait()
        code = daemon.returncode
        assert code is not None
        await daemon.aclose()
        self.daemon = None
        return code

    async def start_executor(
        self,
        executor_id: str,
        argv: Sequence[str],
        *,
        wait_ready: bool = True,
        capture_first_line: bool = False,
    ) -> anyio.abc.Process:
        """Start ``python -m <argv...> --socket <executors.sock> --id <id>``."""
        log_path = self.root / f"executor-{executor_id}.log"
        log = log_path.open("ab")
        try:
            proc = await anyio.open_process(
                [
                    sys.executable,
                    "-m",
                    *argv,
                    "--socket",
                    str(self.executor_socket),
                    "--id",
                    executor_id,
                ],
                stdin=None,
                stdout=subprocess.PIPE if capture_first_line else log,
                stderr=log,
                env=self._child_env(),
                start_new_session=True,
            )
        finally:
            log.close()
        self.executors[executor_id] = proc
        if capture_first_line:
            assert proc.stdout is not None
            line = b""
            with anyio.fail_after(10):
                while not line.endswith(b"\n"):
                    chunk = await proc.stdout.receive(1)
                    line += chunk
            self.page_base_url = line.decode().strip()
        if wait_ready:
            async with ControlClient(self.control_socket) as client:
                await client.call(
                    "executors.wait", executor_id=executor_id, status=None, timeout_s=10
                )
        return proc

    async def stop_executor(self, executor_id: str, sig: signal.Signals = signal.SIGTERM) -> None:
        proc = self.executors.pop(executor_id, None)
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            with anyio.move_on_after(5):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await proc.aclose()

    async def aclose(self) -> None:
        """Stop every executor, then the daemon (SIGTERM; SIGKILL if it lingers)."""
        with anyio.CancelScope(shield=True):
            for executor_id in list(self.executors):
                await self.stop_executor(executor_id)
            if self.daemon is not None:
                await self.stop_daemon()


@contextlib.asynccontextmanager
async def demo_stack(
    root: Path, *, fresh: bool = True, config_text: str = DEMO_CONFIG
) -> AsyncIterator[DemoStack]:
    config = prepare_root(root, fresh=fresh, config_text=config_text)
    stack = DemoStack(root=root, config_path=config)
    try:
        yield stack
    finally:
        await stack.aclose()


# --------------------------------------------------------------------------------------------
# The demo run


async def _run_batch(
    client: ControlClient,
    session_id: str,
    batch: Sequence[Expectation],
    *,
    sequential: bool,
    show: Callable[[str], None],
) -> list[DemoResult]:
    results: list[DemoResult | None] = [None] * len(batch)

    async def one(i: int, exp: Expectation) -> None:
        submitted = await client.call(
            "turn.submit", session_id=session_id, **exp.params, idempotency_key=f"demo-{exp.label}"
        )
        turn_id = submitted["turn"]["turn_id"]
        turn = (await client.call("turn.wait", turn_id=turn_id, timeout_s=30))["turn"]
        results[i] = _check(exp, turn)
        mark = "ok " if results[i] is not None and results[i].ok else "BAD"  # type: ignore[union-attr]
        show(f"  [{mark}] turn {turn_id:>3} {exp.label:<32} -> {turn['state']}")

    if sequential:
        for i, exp in enumerate(batch):
            await one(i, exp)
    else:
        async with anyio.create_task_group() as tg:
            for i, exp in enumerate(batch):
                tg.start_soon(one, i, exp)
    return [r for r in results if r is not None]


async def demo_main(root: Path, *, fresh: bool, show: Callable[[str], None]) -> int:
    started = time.monotonic()
    results: list[DemoResult] = []
    problems: list[str] = []
    async with demo_stack(root, fresh=fresh) as stack:
        show(f"hunter demo: root {root}")
        await stack.start_daemon()
        pid = stack.daemon.pid if stack.daemon else "?"
        show(f"daemon ready (pid {pid}), control {stack.control_socket}")
        await stack.start_executor(
            "web-1",
            ["supervisor.examples.web_executor", "--serve-pages", "--slots", "1"],
            capture_first_line=True,
        )
        show(f"web executor ready; demo pages at {stack.page_base_url}")
        async with ControlClient(stack.control_socket) as client:
            session = await client.call("session.open", package_id="demo")
            sid = session["session_id"]
            show(f"session {sid} opened (package demo)")

            show("round 1: the web executor (every command type) and process turns")
            async with anyio.create_task_group() as tg:

                async def web() -> None:
                    results.extend(
                        await _run_batch(
                            client, sid, web_batch(stack.page_base_url), sequential=True, show=show
                        )
                    )

                async def processes() -> None:
                    results.extend(
                        await _run_batch(client, sid, process_batch(), sequential=False, show=show)
                    )

                tg.start_soon(web)
                tg.start_soon(processes)

            escalated = [r for r in results if r.turn["state"] == "escalated"]
            for r in escalated:
                turn_id = r.turn["turn_id"]
                why = "over its memory limit by design"
                show(
                    f"operator: `hunter escalations resolve {turn_id} --terminate --reason '{why}'`"
                )
                resolved = (
                    await client.call(
                        "escalations.resolve", turn_id=turn_id, action="terminate", reason=why
                    )
                )["turn"]
                r.turn = resolved
                r.ok = r.ok and resolved["state"] == "terminated"
                r.expected = "escalated -> terminated"

            show("round 2: the web executor leaves; chaos executors take over")
            await stack.stop_executor("web-1")
            for executor_id, command, behaviour in CHAOS_ROUND:
                await stack.start_executor(
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
            results.extend(
                await _run_batch(client, sid, chaos_batch(), sequential=False, show=show)
            )
            info = (await client.call("executors.list"))["executors"]
            authority = next((e for e in info if e["executor_id"] == "chaos-authority"), None)
            if authority is None or not authority.get("quarantined_until_us"):
                problems.append("chaos-authority was not quarantined")
            else:
                show("chaos-authority is quarantined (disconnected, refused for a cool-down)")
            for executor_id, _, _ in CHAOS_ROUND:
                await stack.stop_executor(executor_id)

            show("round 3: more lying executors")
            for executor_id, command, behaviour in CHAOS_ROUND_2:
                await stack.start_executor(
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
            results.extend(
                await _run_batch(client, sid, chaos_batch_2(), sequential=False, show=show)
            )

            verify = await client.call("ledger.verify")
            await client.call("session.close", session_id=sid)
        show("")
        show(format_results(sorted(results, key=lambda r: r.turn["turn_id"])))
        show("")
        for ledger in verify["ledgers"]:
            show(f"ledger ok: {ledger['ledger_id']} ({ledger['entries']} entries)")
        for failure in verify["failures"]:
            problems.append(f"ledger of {failure['session_id']} failed: {failure['error']}")
        code = await stack.stop_daemon(signal.SIGTERM)
        show(f"daemon drained and stopped (exit {code})")
        if code != 0:
            problems.append(f"daemon exited {code}")
    bad = [r for r in results if not r.ok]
    for r in bad:
        problems.append(
            f"turn {r.turn['turn_id']} ({r.label}): {r.turn['state']}, expected {r.expected}"
            + (f"; {r.note}" if r.note else "")
        )
    elapsed = time.monotonic() - started
    if problems:
        show(f"hunter demo: FAILED after {elapsed:.1f} s")
        for p in problems:
            show(f"  - {p}")
        return 1
    show(
        f"hunter demo: all {len(results)} outcomes as expected, every ledger verified "
        f"({elapsed:.1f} s)"
    )
    return 0


def run_demo(*, root: Path | None, fresh: bool, keep: bool) -> int:
    """Entry point of `hunter demo` (see the module docstring)."""

    def show(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    base: Path | None = None
    if root is None:
        base = Path(tempfile.mkdtemp(prefix="hunter-demo-"))
        os.chmod(base, 0o711)
        target = base / "root"
    else:
        target = root.absolute()
    try:
        code = anyio.run(lambda: demo_main(target, fresh=fresh or root is None, show=show))
    except StartError as exc:
        sys.stderr.write(f"hunter demo: {exc}\n")
        code = 1
    if base is not None:
        if keep or code != 0:
            show(f"demo root kept: {target} (logs: daemon.log, executor-*.log)")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return code
