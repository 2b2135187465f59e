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
from typing import Any, Final

import anyio
import anyio.abc

from supervisor.control.client import ControlClient, socket_for_root

__all__ = [
    "DEMO_CONFIG",
    "DEMO_MANIFEST",
    "DemoStack",
    "Expectation",
    "prepare_root",
    "run_demo",
]


#: The demo daemon's config: everything short so that faults play out in seconds.
DEMO_CONFIG: Final = """\
# hunter demo: short timeouts and backoff so that every fault plays out in seconds
drain_grace_s = 2.0

[executors]
heartbeat_interval_s = 0.5
heartbeat_misses = 3
queue_wait_s = 3.0
quarantine_s = 60.0
cancel_grace_s = 0.5
hello_timeout_s = 2.0

[retry]
max_attempts = 3
base_delay_ms = 50
backoff_multiplier = 2.0
max_delay_ms = 200

[sandbox]
enforcement = "best-effort"
default_timeout_ms = 5000

[log]
format = "json"
level = "info"
"""

#: Fallback copy of examples/packages/demo/manifest.json (used when run from an install).
DEMO_MANIFEST: Final = """\
{
  "id": "demo",
  "version": "1.0",
  "description": "The package `hunter demo` opens its session with.",
  "capabilities": {
    "read": ["/usr/**", "/etc/**"],
    "write": ["**"],
    "execute": ["/usr/bin/*", "/bin/*", "/usr/local/bin/*"],
    "forbidden": ["/etc/shadow", "/etc/gshadow", "/root/**"],
    "network": false
  },
  "limits": {"memory_mb": 64, "pids": 32, "timeout_s": 60}
}
"""


def _source_manifest() -> str:
    here = Path(__file__).resolve().parent.parent / "examples" / "packages" / "demo"
    path = here / "manifest.json"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return DEMO_MANIFEST


def prepare_root(root: Path, *, fresh: bool, config_text: str = DEMO_CONFIG) -> Path:
    """Create *root* with the demo config and package; returns the config file's path."""
    if fresh and root.exists():
        shutil.rmtree(root)
    (root / "installed" / "demo").mkdir(parents=True, exist_ok=True)
    (root / "installed" / "demo" / "manifest.json").write_text(_source_manifest(), "utf-8")
    config = root / "hunter.toml"
    config.write_text(config_text, encoding="utf-8")
    return config


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
                self.daemon = await anyio.open_process(
                    [
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
                    ],
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
# The demo batch


@dataclass(frozen=True, slots=True)
class Expectation:
    """One demo turn: what is submitted and the state it must end in."""

    label: str
    params: Mapping[str, object]
    expect: str
    expect_decisions: tuple[str, ...] | None = None


def _instruction(command: str, **extra: object) -> dict[str, object]:
    return {"kind": "instruction", "command_type": command, "declared_outputs": [], **extra}


def _process(argv: Sequence[str], **extra: object) -> dict[str, object]:
    return {"kind": "process", "argv": list(argv), "declared_outputs": [], **extra}


def web_batch(base_url: str) -> list[Expectation]:
    """Every command type against the demo pages (run in order: the executor has one tab)."""
    return [
        Expectation(
            "web NAVIGATE", _instruction("NAVIGATE", target_url=base_url + "/"), "succeeded"
        ),
        Expectation("web READ", _instruction("READ", target_selector="#title"), "succeeded"),
        Expectation(
            "web CLICK link",
            _instruction("CLICK", target_selector="#catalogue-link"),
            "succeeded",
        ),
        Expectation(
            "web EXTRACT",
            _instruction("EXTRACT", target_selector=".name", parameters={"max_items": 100}),
            "succeeded",
        ),
        Expectation("web SCROLL", _instruction("SCROLL", parameters={"lines": 10}), "succeeded"),
        Expectation("web SCREENSHOT", _instruction("SCREENSHOT"), "succeeded"),
    ]


def process_batch() -> list[Expectation]:
    out = '"$HUNTER_OUTPUT_DIR/result.txt"'
    return [
        Expectation(
            "process writes declared file",
            _process(
                ["sh", "-c", f"echo hello > {out}"],
                declared_outputs=[{"path": "result.txt", "role": "report"}],
            ),
            "succeeded",
        ),
        Expectation("process exits 3", _process(["sh", "-c", "exit 3"]), "failed"),
        Expectation(
            "process exits 3 in GREEN",
            _process(["sh", "-c", "exit 3"], phase="GREEN"),
            "exhausted",
            ("RETRY", "RETRY", "EXHAUSTED"),
        ),
        Expectation(
            "process sleeps past deadline",
            _process(["sleep", "10"], timeout_ms=300),
            "timeout",
            ("RETRY", "RETRY", "TERMINATE"),
        ),
        Expectation(
            "process writes undeclared file",
            _process(["sh", "-c", 'echo x > "$HUNTER_OUTPUT_DIR/sneaky.txt"']),
            "violation",
        ),
        Expectation(
            "process exceeds memory limit",
            _process(["python3", "-c", "b = bytearray(512 << 20)"]),
            "escalated",
            ("ESCALATE",),
        ),
    ]


#: Chaos executors of the second round: (id, command advertised, behaviour spec).
CHAOS_ROUND: Final[tuple[tuple[str, str, str], ...]] = (
    ("chaos-flaky", "READ", "error,ok"),
    ("chaos-crash", "CLICK", "crash"),
    ("chaos-backup", "CLICK", "ok"),
    ("chaos-hang", "SCROLL", "hang"),
    ("chaos-liar", "EXTRACT", "wrong-id"),
    ("chaos-authority", "SCREENSHOT", "authority"),
    ("chaos-partial", "NAVIGATE", "partial"),
)
CHAOS_ROUND_2: Final[tuple[tuple[str, str, str], ...]] = (
    ("chaos-refuse", "READ", "refuse"),
    ("chaos-no-evidence", "EXTRACT", "no-evidence"),
)


def chaos_batch() -> list[Expectation]:
    return [
        Expectation(
            "chaos errors, then recovers",
            _instruction("READ", target_selector="#title"),
            "succeeded",
            ("RETRY", "SUCCEED"),
        ),
        Expectation(
            "chaos crashes; retry elsewhere",
            _instruction("CLICK", target_selector="#hello"),
            "succeeded",
            ("RETRY", "SUCCEED"),
        ),
        Expectation(
            "chaos hangs",
            _instruction("SCROLL", timeout_ms=300),
            "timeout",
            ("RETRY", "RETRY", "TERMINATE"),
        ),
        Expectation(
            "chaos lies (wrong id)",
            _instruction("EXTRACT", target_selector="li"),
            "terminated",
            ("TERMINATE",),
        ),
        Expectation(
            "chaos claims authority",
            _instruction("SCREENSHOT"),
            "violation",
            ("TERMINATE",),
        ),
        Expectation(
            "chaos partial output",
            _instruction("NAVIGATE", target_url="http://127.0.0.1:9/"),
            "terminated",
            ("TERMINATE",),
        ),
    ]


def chaos_batch_2() -> list[Expectation]:
    return [
        Expectation("chaos refuses", _instruction("READ", target_selector="p"), "terminated"),
        Expectation(
            "chaos SUCCESS without evidence",
            _instruction("EXTRACT", target_selector="p"),
            "terminated",
        ),
    ]


@dataclass
class DemoResult:
    label: str
    expected: str
    turn: dict[str, Any]
    ok: bool
    note: str = ""


def _check(exp: Expectation, turn: dict[str, Any]) -> DemoResult:
    decisions = tuple(a.get("decision") or "-" for a in turn["attempts"])
    ok = turn["state"] == exp.expect
    note = ""
    if exp.expect_decisions is not None and decisions != exp.expect_decisions:
        ok = False
        note = f"decisions {decisions} != {exp.expect_decisions}"
    return DemoResult(exp.label, exp.expect, turn, ok, note)


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


def _result_text(r: DemoResult) -> str:
    if not r.ok:
        return f"{r.turn['state']} (expected {r.expected})"
    return r.expected if "->" in r.expected else str(r.turn["state"])


def format_results(results: Sequence[DemoResult]) -> str:
    from supervisor.cli.commands import table

    rows: list[tuple[object, ...]] = []
    for r in results:
        t = r.turn
        attempts = t["attempts"] or [{}]
        for i, a in enumerate(attempts):
            first = i == 0
            rows.append(
                (
                    t["turn_id"] if first else "",
                    r.label if first else "",
                    a.get("attempt", "-"),
                    a.get("executor_id") or ("sandbox" if t["kind"] == "process" else "-"),
                    a.get("fault_type") or (a.get("outcome") or "-"),
                    a.get("decision") or "-",
                    a.get("reason_code") or "-",
                    _result_text(r) if first else "",
                )
            )
    return table(
        ("TURN", "WHAT", "ATT", "EXECUTOR", "FAULT/OUTCOME", "DECISION", "REASON", "RESULT"),
        rows,
    )


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
                show(f"operator: `hunter escalations resolve {turn_id} --terminate`")
                resolved = (
                    await client.call("escalations.resolve", turn_id=turn_id, action="terminate")
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
