"""The nemesis's load: mixed turns submitted round-robin to the three daemons, every call recorded.

Sessions of the nemesis package are opened on every daemon before the faults begin (two each:
each daemon starts as the home of two). Then turn *i* of the run is submitted at its scheduled
moment (``i * duration / turns`` after the start) to daemon ``i mod 3``, for session
``(i div 3) mod sessions``: most submissions reach a daemon that is not the session's home.
Every submission carries an idempotency key of its own (``s<seed>-<i>``).

About one turn in ``process_every`` is a small process turn (`process_argv`): it sleeps a
moment, then writes ``run-<key>.log`` in its output directory, declared as its only output, so
that the daemon promotes it into the session's workspace when the turn succeeds. The file holds
the record promoted before it (the turn reads it back from the workspace: the nemesis package
may read the run's workspaces) plus one line for this run naming the key, the turn number, the
output directory (which names the root, so the daemon that ran it) and a nanosecond clock. A
command that ran to completion twice, on two daemons or on one, leaves two lines. The rest are
``READ`` instruction turns for the no-op executors.

Each call is bounded by ``call_timeout_s``. A call that fails or times out is sent again, with
the same key, to the next daemon after ``retry_pause_s``, until one acknowledges it or the
load's give-up moment passes; about one acknowledged key in ``resubmit_every`` is sent once more
to another daemon, which must answer with the same turn, and about one key in ``twin_every`` is
sent to two daemons at the same moment (both must answer with one turn, at most one of them
``created``). Each invocation and completion goes to
the `tests.storms.history.History`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio

from supervisor.client import (
    BadRequest,
    Client,
    ConnectionLost,
    DaemonNotRunning,
    Draining,
    HunterError,
    IdempotencyConflict,
    QueueFull,
    SessionClosed,
    TurnHandle,
    UnknownSession,
)
from tests.storms.fleet import NEMESIS_PACKAGE
from tests.storms.history import Completion, History

__all__ = ["Load", "LoadConfig", "LoadStatistics", "SessionRef", "TurnPlan", "process_argv"]

#: refusals after which the daemon did nothing (a ``fail``); every other error is indeterminate
_DEFINITE: Final = (
    BadRequest,
    UnknownSession,
    SessionClosed,
    QueueFull,
    Draining,
    IdempotencyConflict,
)

#: the process turn's command (``$1`` the key, ``$2`` the session's workspace): the record so far
#: from the workspace, then one line for this run; readable by the next run's uid
PROCESS_SCRIPT: Final = (
    'f="run-$1.log"; sleep 0.5; '
    'if [ -r "$2/$f" ]; then cat "$2/$f" > "$f"; fi; '
    'echo "$1 $HUNTER_TURN_NUMBER $HUNTER_OUTPUT_DIR $(date +%s%N)" >> "$f"; chmod 644 "$f"'
)


def process_argv(key: str, workspace: Path) -> list[str]:
    """The argv of the process turn of *key* in a session whose workspace is *workspace*."""
    return ["/bin/sh", "-c", PROCESS_SCRIPT, "nemesis", key, str(workspace)]


def run_file(key: str) -> str:
    """The process turn's declared output (and its record's name in the workspace)."""
    return f"run-{key}.log"


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """How much load, and how the generator behaves towards failing daemons."""

    turns: int = 600
    duration_s: float = 60.0
    #: concurrent submitters (a stalled daemon holds one each until its call times out)
    lanes: int = 32
    process_every: int = 15
    resubmit_every: int = 10
    twin_every: int = 20
    call_timeout_s: float = 20.0
    retry_pause_s: float = 0.25
    sessions_per_daemon: int = 2
    #: how long after the last scheduled submission a key is still retried
    give_up_after_s: float = 30.0


@dataclass(frozen=True, slots=True)
class SessionRef:
    session_id: str
    #: the daemon that opened it (its first home)
    opener: str
    workspace: Path


@dataclass(frozen=True, slots=True)
class TurnPlan:
    index: int
    key: str
    kind: str
    session: SessionRef
    #: the daemon the first submission goes to
    daemon: str
    #: after its acknowledgement, submit it once more to another daemon
    resubmit: bool
    #: submit it to two daemons at the same moment
    twin: bool = False


@dataclass(frozen=True, slots=True)
class LoadStatistics:
    planned: int
    acknowledged: int
    gave_up: int
    calls: int
    errors: int


class Load:
    """The generator: opens the sessions, then submits the planned turns (module docstring)."""

    def __init__(
        self,
        clients: Mapping[str, Client],
        history: History,
        config: LoadConfig,
        *,
        seed: int,
    ) -> None:
        self.clients = dict(clients)
        self.names = sorted(self.clients)
        self.history = history
        self.config = config
        self.seed = seed
        self.sessions: list[SessionRef] = []
        self.in_flight = 0
        self._acknowledged: dict[str, int] = {}
        self._gave_up = 0
        self._calls = 0
        self._errors = 0

    async def open_sessions(self, workspaces: Path) -> list[SessionRef]:
        """`LoadConfig.sessions_per_daemon` sessions of the nemesis package on every daemon,
        each with a workspace of its own under *workspaces* (readable by every sandbox uid)."""
        for n in range(self.config.sessions_per_daemon):
            for name in self.names:
                workspace = workspaces / f"{name}{n}"
                workspace.mkdir(parents=True, exist_ok=True)
                workspace.chmod(0o755)
                with anyio.fail_after(60):
                    session = await self.clients[name].open_session(
                        NEMESIS_PACKAGE, workspace=str(workspace)
                    )
                ref = SessionRef(session.session_id, name, workspace)
                self.sessions.append(ref)
                self.history.record(
                    "session", session_id=ref.session_id, daemon=name, workspace=str(workspace)
                )
        return self.sessions

    def plan(self) -> list[TurnPlan]:
        """The run's turns, drawn from the seed (the same seed plans the same load)."""
        rng = random.Random(f"load-{self.seed}")
        plans = []
        for i in range(self.config.turns):
            process = rng.randrange(self.config.process_every) == 0
            plans.append(
                TurnPlan(
                    index=i,
                    key=f"s{self.seed}-{i:05d}",
                    kind="process" if process else "instruction",
                    session=self.sessions[(i // len(self.names)) % len(self.sessions)],
                    daemon=self.names[i % len(self.names)],
                    resubmit=rng.randrange(self.config.resubmit_every) == 0,
                    twin=rng.randrange(self.config.twin_every) == 0,
                )
            )
        return plans

    def statistics(self) -> LoadStatistics:
        return LoadStatistics(
            planned=self.config.turns,
            acknowledged=len(self._acknowledged),
            gave_up=self._gave_up,
            calls=self._calls,
            errors=self._errors,
        )

    async def run(self) -> LoadStatistics:
        """Submit every planned turn at its moment; returns when each is acknowledged or given
        up on."""
        plans = self.plan()
        start = anyio.current_time()
        spacing = self.config.duration_s / max(1, len(plans))
        give_up = start + self.config.duration_s + self.config.give_up_after_s
        queue = iter(plans)

        async def lane() -> None:
            for plan in queue:
                due = start + plan.index * spacing
                await anyio.sleep_until(due)
                await self._one(plan, give_up)

        async with anyio.create_task_group() as tg:
            for _ in range(self.config.lanes):
                tg.start_soon(lane)
        return self.statistics()

    async def _one(self, plan: TurnPlan, give_up: float) -> None:
        """Submit *plan* until acknowledged (to the next daemon after each failure)."""
        order = (
            self.names[self.names.index(plan.daemon) :]
            + self.names[: self.names.index(plan.daemon)]
        )
        attempt = 0
        turn_id: int | None = None
        if plan.twin:
            # the same key to two daemons at once: both must answer with one turn
            answers: list[int | None] = [None, None]

            async def one(i: int) -> None:
                answers[i] = await self._submit(plan, order[i], i + 1)

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 0)
                tg.start_soon(one, 1)
            attempt = 2
            turn_id = answers[0] if answers[0] is not None else answers[1]
        while turn_id is None:
            daemon = order[attempt % len(order)]
            attempt += 1
            turn_id = await self._submit(plan, daemon, attempt)
            if turn_id is not None:
                break
            if anyio.current_time() >= give_up:
                self._gave_up += 1
                self.history.record("gave_up", key=plan.key, attempts=attempt)
                return
            await anyio.sleep(self.config.retry_pause_s)
        self._acknowledged[plan.key] = turn_id
        if plan.resubmit:
            again = order[attempt % len(order)]
            await self._submit(plan, again, attempt + 1)

    async def _submit(self, plan: TurnPlan, daemon: str, attempt: int) -> int | None:
        """One ``turn.submit`` of *plan* to *daemon*, recorded; the turn id if acknowledged."""
        client = self.clients[daemon]
        session = plan.session
        call = self.history.invoke(
            key=plan.key,
            daemon=daemon,
            kind=plan.kind,
            session_id=session.session_id,
            attempt=attempt,
        )
        self._calls += 1
        self.in_flight += 1
        outcome: Completion = "info"
        fields: dict[str, object] = {}
        try:
            with anyio.fail_after(self.config.call_timeout_s):
                await client.reconnect_if_lost()
                handle = await self._send(client, plan)
        except _DEFINITE as exc:
            outcome, fields = "fail", {"code": exc.code, "error": f"{type(exc).__name__}: {exc}"}
        except HunterError as exc:
            fields = {"code": exc.code, "error": f"{type(exc).__name__}: {exc}"}
        except TimeoutError:
            fields = {"code": "timeout", "error": f"no answer in {self.config.call_timeout_s} s"}
        except (ConnectionLost, DaemonNotRunning, OSError) as exc:
            fields = {"code": "connection", "error": f"{type(exc).__name__}: {exc}"}
        else:
            self.in_flight -= 1
            self.history.complete(call, "ok", turn_id=handle.turn_id, created=handle.created)
            return handle.turn_id
        self.in_flight -= 1
        self._errors += 1
        self.history.complete(call, outcome, **fields)
        return None

    async def _send(self, client: Client, plan: TurnPlan) -> TurnHandle:
        session = plan.session
        if plan.kind == "process":
            return await client.submit_process(
                session.session_id,
                process_argv(plan.key, session.workspace),
                declared_outputs=[run_file(plan.key)],
                idempotency_key=plan.key,
            )
        return await client.submit_instruction(
            session.session_id, "READ", selector=f"#{plan.key}", idempotency_key=plan.key
        )
