"""The tools an agent calls. Each is a method of `Tools`, registered by `supervisor.mcp.app`;
its docstring is the description the model reads, its signature the input schema (checked by
the SDK before the method runs), its return type the output schema.

A tool that runs something submits one turn through the client library with ``requested_by``
(`supervisor.mcp.attribution`), follows it with ``turn.wait`` and relays its events as progress
(`supervisor.mcp.progress`). If the MCP client cancels the call, the turn is cancelled too. That
course of a turn is `supervisor.mcp.course`; this module holds the tools' schemas and checks.
Refusals are `supervisor.mcp.errors` (a tool error saying what to change; nothing was run).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import anyio
from mcp.server.mcpserver import Context
from pydantic import Field

from supervisor.client import HunterError, TurnHandle
from supervisor.control.answers import package_answer
from supervisor.mcp.answers import (
    DecisionAnswer,
    FileEntryModel,
    FileListing,
    FileRead,
    LedgerVerified,
    PackageInfo,
    PackageList,
    SessionAnswer,
    TurnOutcome,
    bounded_text,
    outcome_of,
)
from supervisor.mcp.backend import Backend
from supervisor.mcp.course import TurnCourse, refused
from supervisor.mcp.errors import BadInput
from supervisor.mcp.limits import SessionBucket
from supervisor.mcp.workspace import list_files, read_slice, relative_path

__all__ = ["Tools"]

SessionId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._:-]+$",
        description="a session id that open_session returned",
    ),
]
TurnId = Annotated[int, Field(ge=1, lt=2**63, description="a turn id a tool returned")]
WaitS = Annotated[
    float | None,
    Field(
        ge=0,
        le=3600,
        description="how long to wait for the turn to settle, in seconds (default: the"
        " server's; capped by its max_wait_s); 0 answers at once",
    ),
]
Phase = Literal["RED", "GREEN", "VERIFY", "REFACTOR"]
CommandType = Literal["NAVIGATE", "CLICK", "READ", "SCROLL", "SCREENSHOT", "EXTRACT"]
Reason = Annotated[str, Field(min_length=1, max_length=2000)]

#: while an escalated turn waits, its state is read again this often (events come first)
_ESCALATED_POLL_S: Final = 2.0


class Tools:
    """The tools of one server, over its `Backend`."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._settings = backend.settings
        self._client = backend.client
        self._course = TurnCourse(backend)

    # -- who and where --------------------------------------------------------------------

    def _bucket(self, ctx: Context) -> SessionBucket:
        headers = ctx.headers or {}
        return self._backend.limits.bucket(headers.get("mcp-session-id", ""))

    # -- packages and sessions ------------------------------------------------------------

    async def list_packages(self) -> PackageList:
        """List the agent packages installed on the daemon, with their capabilities (what a
        session's commands may read, write and execute, what is forbidden, whether there is
        network) and limits, and whether this server lets you open a session on each. Call it
        first to choose the package_id for open_session."""
        installed = self._backend.root / "installed"
        names = await anyio.to_thread.run_sync(
            lambda: (
                sorted(p.name for p in installed.iterdir() if p.is_dir())
                if installed.is_dir()
                else []
            )
        )
        packages: list[PackageInfo] = []
        for name in names:
            answer = await anyio.to_thread.run_sync(
                package_answer, installed / name / "manifest.json"
            )
            manifest = answer.get("package")
            info = PackageInfo(package_id=name, allowed=self._settings.allows(name))
            if isinstance(manifest, dict):
                caps, limits = manifest.get("capabilities"), manifest.get("limits")
                info.version = str(manifest.get("version")) if manifest.get("version") else None
                info.description = (
                    str(manifest["description"]) if manifest.get("description") else None
                )
                info.capabilities = caps if isinstance(caps, dict) else None
                info.limits = limits if isinstance(limits, dict) else None
            else:
                info.problem = str(answer.get("package_problem"))
            packages.append(info)
        return PackageList(packages=packages)

    async def open_session(
        self,
        *,
        package_id: Annotated[
            str, Field(min_length=1, max_length=256, description="a package from list_packages")
        ],
        ctx: Context,
        work_order_id: Annotated[
            str | None, Field(max_length=256, description="your task's id, recorded in the ledgers")
        ] = None,
    ) -> SessionAnswer:
        """Open a session on an agent package: a sandbox (its own TMPDIR and output area, the
        package's capabilities, kernel-enforced) with two hash-chained ledgers of everything
        run in it. Returns the session_id every other tool takes, and the workspace where
        the declared outputs of successful commands land."""
        if not self._settings.allows(package_id):
            allowed = ", ".join(sorted(self._settings.allowed_packages or ()))
            raise BadInput(
                f"package {package_id!r} is not one this server opens sessions on; use one of:"
                f" {allowed or '(none)'}"
            )
        bucket = self._bucket(ctx)
        try:
            session = await self._client.open_session(package_id, work_order_id=work_order_id)
        except HunterError as exc:
            raise refused(exc) from None
        bucket.sessions.add(session.session_id)
        workspace = await self._backend.workspace(session.session_id)
        return SessionAnswer(
            session_id=session.session_id,
            package_id=session.package_id,
            state=session.state,
            workspace=str(workspace),
            turns=session.turns,
        )

    async def close_session(self, *, session_id: SessionId, ctx: Context) -> SessionAnswer:
        """Close a session opened with open_session (its turns must have ended: cancel the
        ones still running first). Its ledgers and workspace stay."""
        self._bucket(ctx).owns_session(session_id)
        try:
            session = await self._client.close_session(session_id)
        except HunterError as exc:
            raise refused(exc) from None
        workspace = await self._backend.workspace(session_id)
        return SessionAnswer(
            session_id=session.session_id,
            package_id=session.package_id,
            state=session.state,
            workspace=str(workspace),
            turns=session.turns,
        )

    # -- turns ----------------------------------------------------------------------------

    async def run_command(
        self,
        *,
        session_id: SessionId,
        argv: Annotated[
            list[Annotated[str, Field(min_length=1, max_length=32_768)]],
            Field(
                min_length=1,
                max_length=256,
                description="the command and its arguments, no shell: e.g. ['/usr/bin/python3',"
                " 'test_app.py'] or ['/bin/sh', '-c', 'echo hi > out.txt']; the program must be"
                " one the package may execute (an absolute path)",
            ),
        ],
        ctx: Context,
        declared_outputs: Annotated[
            list[Annotated[str, Field(min_length=1, max_length=4096)]],
            Field(
                max_length=64,
                description="every file the command writes, relative to its working directory"
                " (e.g. ['app.py']): a write not declared is a violation and nothing is"
                " promoted; declared files are promoted into the session's workspace",
            ),
        ] = [],  # noqa: B006  # the SDK copies argument defaults into the schema; never mutated
        timeout_s: Annotated[
            float, Field(gt=0, le=600, description="per attempt, in seconds")
        ] = 30.0,
        phase: Annotated[
            Phase | None,
            Field(
                description="your phase: GREEN and VERIFY retry failures, RED and REFACTOR do not"
            ),
        ] = None,
        wait_s: WaitS = None,
    ) -> TurnOutcome:
        """Run a command in the session's sandbox as a supervised turn: confined to the
        package's capabilities, with a timeout, retries by the daemon's policy and both
        ledgers written. Answers with the exit code, stdout and stderr (bounded; `truncated`
        says when bytes were left out), the files it wrote (realized_writes) and those
        promoted into the workspace, any violations, the decision and its reason code, the
        turn id and its ledger hashes. A turn that escalates comes back with
        waiting_for_operator: a person decides, not you (wait_turn waits for it)."""
        bucket = self._bucket(ctx)
        bucket.owns_session(session_id)
        if any("\x00" in a for a in argv):
            raise BadInput("argv: an argument holds a NUL byte; remove it")
        size = sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in argv)
        if size > self._settings.max_argv_bytes:
            raise BadInput(
                f"argv: {size} bytes, over this server's {self._settings.max_argv_bytes}: write"
                " long input into a file first and pass its path"
            )
        if len(argv) > self._settings.max_argv:
            raise BadInput(f"argv: {len(argv)} arguments, over {self._settings.max_argv}")
        for path in declared_outputs:
            relative_path(path)  # absolute or climbing out: refused before anything runs
        who = self._course.requested_by(ctx)
        timeout_ms = max(1, round(timeout_s * 1000))

        async def submit() -> TurnHandle:
            return await self._client.submit_process(
                session_id,
                argv,
                declared_outputs=declared_outputs,
                phase=phase,
                timeout_ms=timeout_ms,
                requested_by=who,
                compact=True,
            )

        return await self._course.run(bucket, ctx, submit, wait_s)

    async def submit_instruction(
        self,
        *,
        session_id: SessionId,
        command_type: Annotated[CommandType, Field(description="what the executor does")],
        ctx: Context,
        selector: Annotated[
            str | None, Field(max_length=4096, description="the target's CSS selector")
        ] = None,
        url: Annotated[str | None, Field(max_length=8192, description="the target URL")] = None,
        parameters: Annotated[
            dict[str, str | int | bool] | None,
            Field(max_length=64, description="the command's parameters"),
        ] = None,
        timeout_s: Annotated[float, Field(gt=0, le=600, description="per attempt")] = 30.0,
        phase: Phase | None = None,
        wait_s: WaitS = None,
    ) -> TurnOutcome:
        """Send an instruction to an external executor (a browser agent: NAVIGATE, CLICK,
        READ, SCROLL, SCREENSHOT, EXTRACT) as a supervised turn, and get its result: the
        executor's output (bounded), the evidence hash, the decision and reason code, and the
        ledger hashes. The daemon's safety rules judge the executor's answer."""
        bucket = self._bucket(ctx)
        bucket.owns_session(session_id)
        who = self._course.requested_by(ctx)
        timeout_ms = max(1, round(timeout_s * 1000))

        async def submit() -> TurnHandle:
            return await self._client.submit_instruction(
                session_id,
                command_type,
                selector=selector,
                url=url,
                parameters=parameters,
                phase=phase,
                timeout_ms=timeout_ms,
                requested_by=who,
                compact=True,
            )

        return await self._course.run(bucket, ctx, submit, wait_s)

    async def wait_turn(
        self, *, turn_id: TurnId, ctx: Context, wait_s: WaitS = None
    ) -> TurnOutcome:
        """Wait (bounded) for a turn you started to settle, and get its outcome as run_command
        gives it. For a turn waiting for an operator, this waits for the person's decision
        (retry or terminate) and what follows; it never decides it."""
        bucket = self._bucket(ctx)
        bucket.owns_turn(turn_id)
        deadline = anyio.current_time() + self._course.wait_s(wait_s)
        with self._backend.watch.watch(turn_id) as events:
            turn = await self._course.compact(turn_id, 0)
            while turn.state == "escalated" and anyio.current_time() < deadline:
                with anyio.move_on_after(min(_ESCALATED_POLL_S, deadline - anyio.current_time())):
                    while True:
                        event = await events.receive()
                        if event.kind in ("escalation.resolved", "turn.ended"):
                            break
                turn = await self._course.compact(turn_id, 0)
            if not turn.settled:
                turn = await self._course.compact(
                    turn_id, max(0.0, deadline - anyio.current_time())
                )
        return await self._course.outcome(bucket, turn, wait_s)

    async def cancel_turn(
        self, *, turn_id: TurnId, ctx: Context, reason: Reason | None = None
    ) -> TurnOutcome:
        """Cancel a turn you started (a running attempt is stopped first). A turn already
        ended comes back as it is."""
        bucket = self._bucket(ctx)
        bucket.owns_turn(turn_id)
        try:
            turn = await self._client.cancel(
                turn_id,
                reason=reason or "cancelled by the agent",
                operator=self._course.operator(ctx),
            )
        except HunterError as exc:
            raise refused(exc) from None
        return await self._course.outcome(bucket, turn, 0)

    async def decision_record(self, *, turn_id: TurnId, ctx: Context) -> DecisionAnswer:
        """A turn's decision record: every attempt with its outcome, fault, decision, reason
        code and backoff; who asked for it; and its entries in the session's exec and evidence
        ledgers (their hashes)."""
        bucket = self._bucket(ctx)
        bucket.owns_turn(turn_id)
        try:
            record = await self._client.decision_record(turn_id)
        except HunterError as exc:
            raise refused(exc) from None
        outcome, spent = outcome_of(
            record.turn, record, self._backend.limits.output_allowance(bucket)
        )
        self._backend.limits.charge(bucket, spent)
        spec = record.turn.spec or {}
        requested = spec.get("requested_by")
        return DecisionAnswer(
            outcome=outcome,
            attempts=[a.to_dict() for a in record.turn.attempts],
            requested_by=requested if isinstance(requested, dict) else None,
            exec_entries=[e.to_dict() for e in record.exec],
            evidence_entries=[e.to_dict() for e in record.evidence],
        )

    # -- ledgers and files ----------------------------------------------------------------

    async def verify_ledger(self, *, session_id: SessionId, ctx: Context) -> LedgerVerified:
        """Verify the session's two hash-chained ledgers (every hash recomputed, every link
        and the anchored head checked) and return each one's head: its last sequence number
        and entry hash."""
        self._bucket(ctx).owns_session(session_id)
        try:
            check = await self._client.verify_ledgers(session_id=session_id)
        except HunterError as exc:
            if exc.code == "ledger_invalid":
                return LedgerVerified(
                    session_id=session_id, ok=False, ledgers=[], problem=exc.message
                )
            raise refused(exc) from None
        data = check.to_dict()
        ledgers = data.get("ledgers")
        return LedgerVerified(
            session_id=session_id,
            ok=bool(data.get("ok", True)),
            ledgers=[dict(x) for x in ledgers if isinstance(x, dict)]
            if isinstance(ledgers, list)
            else [],
        )

    async def read_file(
        self,
        *,
        session_id: SessionId,
        path: Annotated[
            str,
            Field(
                min_length=1,
                max_length=4096,
                description="relative to the session's workspace, e.g. 'out.txt'",
            ),
        ],
        ctx: Context,
        offset: Annotated[int, Field(ge=0, le=2**53, description="first byte to read")] = 0,
        max_bytes: Annotated[
            int | None, Field(ge=1, le=16 * 1024 * 1024, description="bytes to read at most")
        ] = None,
    ) -> FileRead:
        """Read a file from the session's workspace (where declared outputs are promoted),
        bounded: read on from offset + returned_bytes while `more`. Paths outside the
        workspace (absolute, '..', or a link leading out) are refused."""
        bucket = self._bucket(ctx)
        bucket.owns_session(session_id)
        workspace = await self._backend.workspace(session_id)
        allowance = self._backend.limits.output_allowance(bucket)
        limit = min(allowance, max_bytes or allowance)
        piece = await anyio.to_thread.run_sync(
            lambda: read_slice(workspace, path, offset=offset, limit=limit)
        )
        self._backend.limits.charge(bucket, len(piece.data))
        left = piece.size - offset
        note = None
        if limit < (max_bytes or left) and len(piece.data) < left:
            note = "this MCP session's output limit: read on from offset + returned_bytes"
        content = bounded_text(piece.data, len(piece.data), cut_before=False, note=note)
        return FileRead(
            path=piece.path, size=piece.size, offset=offset, content=content, more=piece.more
        )

    async def list_outputs(self, *, session_id: SessionId, ctx: Context) -> FileListing:
        """List the files in the session's workspace (the outputs its turns promoted), with
        their sizes: what read_file can read."""
        bucket = self._bucket(ctx)
        bucket.owns_session(session_id)
        workspace = await self._backend.workspace(session_id)
        cap = self._settings.max_listed_files
        files, more = await anyio.to_thread.run_sync(lambda: list_files(workspace, limit=cap))
        return FileListing(
            session_id=session_id,
            files=[FileEntryModel(path=f.path, size=f.size) for f in files],
            truncated=more,
        )
