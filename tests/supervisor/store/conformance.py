"""The `TurnStore` rules, once, for every engine (`test_conformance.py` runs them per engine).

`TurnStoreConformance` holds the tests; a subclass supplies the ``open_store`` fixture: a
`StoreFactory` whose every call opens a store over the *same* storage (a second call after the
first closed is a restart). Nothing here knows an engine: only the protocol, its records and its
errors. The only sleeps wait for a lease of a few milliseconds to expire.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace

import anyio
import pytest

from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.lifecycle import IllegalTransition, TurnKind, TurnState
from supervisor.errors import (
    IntakeClosedError,
    NotEscalatedError,
    SessionClosedError,
    StaleClaimError,
    UnknownSessionError,
    UnknownTurnError,
)
from supervisor.store.protocol import (
    RESOLUTION_REASONS,
    Accepted,
    Claim,
    ClaimFilter,
    NewSession,
    NewTurn,
    Resolution,
    SessionState,
    TurnEnding,
    TurnRecord,
    TurnStore,
)
from supervisor.wire.turn_spec import InstructionSpec, ProcessSpec, TurnSpec

__all__ = ["StoreFactory", "TurnStoreConformance"]

#: Opens a store over one test's storage; the store is closed when the block ends.
StoreFactory = Callable[[], AbstractAsyncContextManager[TurnStore]]

LEASE_MS = 60_000
#: a lease that is over by the time `expire` returns
SHORT_LEASE_MS = 2


def spec(command: str = "READ", **parameters: int) -> InstructionSpec:
    return InstructionSpec(
        timeout_ms=1_000,
        command_type=ExecutorCommandType(command),
        parameters={"n": 1, **parameters},
    )


def instruction(
    session: str = "S1", *, key: str | None = None, command: str = "READ", **parameters: int
) -> NewTurn:
    return NewTurn(session_id=session, spec=spec(command, **parameters), idempotency_key=key)


def process(session: str = "S1") -> NewTurn:
    return NewTurn(session_id=session, spec=ProcessSpec(timeout_ms=1_000, argv=("true",)))


def attempt(n: int, *, decision: str | None = None, **extra: object) -> AttemptRecord:
    return AttemptRecord(
        attempt=n,
        started_us=1_000 * n,
        executor_id="ex-1",
        finished_us=None if decision is None else 1_000 * n + 500,
        outcome=None if decision is None else "FAULT",
        decision=decision,
        extra=extra,
    )


def line(ledger_id: str, seq: int, *, salt: str = "") -> SealedLine:
    """A stand-in sealed line (the store keeps lines as bytes; it does not parse them)."""
    digest = hashlib.sha256(f"{ledger_id}/{seq}{salt}".encode()).hexdigest()
    body = f'{{"ledger_id":"{ledger_id}","seq":{seq},"entry_hash":"{digest}"}}\n'
    return SealedLine(ledger_id, seq, digest, body.encode())


async def expire() -> None:
    """Let a `SHORT_LEASE_MS` lease run out."""
    await anyio.sleep(SHORT_LEASE_MS / 1000 + 0.01)


async def session(store: TurnStore, session_id: str = "S1") -> None:
    await store.open_session(NewSession(session_id=session_id, package_id="demo"))


async def claimed(store: TurnStore, new: NewTurn | None = None, *, owner: str = "A") -> Claim:
    accepted = await store.accept(new or instruction(), claim_for=owner, lease_ms=LEASE_MS)
    assert accepted.claim is not None
    return accepted.claim


async def escalated(store: TurnStore) -> TurnRecord:
    """A turn that ran one attempt and was parked for a person."""
    claim = await store.start_attempt(await claimed(store), attempt(1))
    ending = TurnEnding(state=TurnState.ESCALATED, verdict="ESCALATE", reason_code="ask")
    return await store.finish(claim, ending, [attempt(1, decision="ESCALATE")])


def unchanged(before: TurnRecord, after: TurnRecord) -> None:
    assert after == before


class TurnStoreConformance:
    """Every rule of the `TurnStore` protocol (see `supervisor.store.protocol`)."""

    # -- sessions ---------------------------------------------------------------------------

    async def test_open_get_list_sessions(self, open_store: StoreFactory) -> None:
        """An opened session reads back as open with no turns, and lists by state."""
        async with open_store() as store:
            opened = await store.open_session(
                NewSession(session_id="S1", package_id="demo", tier="t", workspace="/w")
            )
            await session(store, "S2")
            await store.close_session("S2")
            assert opened.state is SessionState.OPEN
            assert (opened.package_id, opened.tier, opened.workspace) == ("demo", "t", "/w")
            assert opened.turns == 0
            assert opened.closed_us is None
            assert await store.get_session("S1") == opened
            assert {s.session_id for s in await store.list_sessions()} == {"S1", "S2"}
            open_ = await store.list_sessions(state=SessionState.OPEN)
            assert [s.session_id for s in open_] == ["S1"]

    async def test_session_tenant_and_priority(self, open_store: StoreFactory) -> None:
        """A session's tenant label and priority read back (after a restart and a close too);
        a session opened without them has neither."""
        async with open_store() as store:
            opened = await store.open_session(
                NewSession(session_id="S1", package_id="demo", tenant="acme", priority=3)
            )
            await session(store, "S2")
            assert (opened.tenant, opened.priority) == ("acme", 3)
            assert opened.to_dict()["tenant"] == "acme"
            assert (await store.close_session("S1")).tenant == "acme"
        async with open_store() as store:
            got = {s.session_id: (s.tenant, s.priority) for s in await store.list_sessions()}
            assert got == {"S1": ("acme", 3), "S2": (None, None)}

    async def test_duplicate_session_refused(self, open_store: StoreFactory) -> None:
        """Opening a session id twice raises ValueError and keeps the first."""
        async with open_store() as store:
            await session(store)
            with pytest.raises(ValueError, match="S1"):
                await store.open_session(NewSession(session_id="S1", package_id="other"))
            assert (await store.get_session("S1")).package_id == "demo"

    async def test_close_session(self, open_store: StoreFactory) -> None:
        """Closing stamps closed_us; closing again changes nothing; unknown ids raise."""
        async with open_store() as store:
            await session(store)
            closed = await store.close_session("S1")
            assert closed.state is SessionState.CLOSED
            assert closed.closed_us is not None
            assert await store.close_session("S1") == closed
            with pytest.raises(UnknownSessionError, match="'nope'"):
                await store.close_session("nope")
            with pytest.raises(UnknownSessionError, match="'nope'"):
                await store.get_session("nope")

    # -- acceptance -------------------------------------------------------------------------

    async def test_accept_numbers_turns(self, open_store: StoreFactory) -> None:
        """Accepted turns are numbered 1, 2... per session, start accepted, keep their spec."""
        async with open_store() as store:
            await session(store)
            await session(store, "S2")
            first = await store.accept(instruction())
            second = await store.accept(process())
            other = await store.accept(instruction("S2"))
            assert (first.turn.turn_number, second.turn.turn_number) == (1, 2)
            assert other.turn.turn_number == 1
            assert first.created
            assert first.claim is None
            assert first.turn.state is TurnState.ACCEPTED
            assert first.turn.attempt == 0
            assert first.turn.owner is None
            assert first.turn.spec == spec()
            assert second.turn.kind is TurnKind.PROCESS
            assert second.turn.turn_id > first.turn.turn_id
            assert (await store.get_session("S1")).turns == 2
            assert await store.get_turn(first.turn.turn_id) == first.turn

    async def test_accept_is_idempotent(self, open_store: StoreFactory) -> None:
        """A resubmitted key returns the first turn, created=False, and writes nothing."""
        async with open_store() as store:
            await session(store)
            await session(store, "S2")
            first = await store.accept(instruction(key="k1"), claim_for="A", lease_ms=LEASE_MS)
            again = await store.accept(instruction(key="k1", different=2), claim_for="B")
            assert not again.created
            assert again.claim is None
            assert again.turn.turn_id == first.turn.turn_id
            assert again.turn.owner == "A"
            assert (await store.get_session("S1")).turns == 1
            assert await store.counts() == {"accepted": 1}
            assert await store.find_turn("S1", "k1") == again.turn
            assert await store.find_turn("S1", "k2") is None
            elsewhere = await store.accept(instruction("S2", key="k1"))
            assert elsewhere.created
            assert elsewhere.turn.turn_id != first.turn.turn_id

    async def test_accept_refuses_unknown_and_closed_sessions(
        self, open_store: StoreFactory
    ) -> None:
        """Accepting into an unknown session or a closed one raises and writes nothing."""
        async with open_store() as store:
            await session(store)
            await store.close_session("S1")
            with pytest.raises(UnknownSessionError, match="'nope'"):
                await store.accept(instruction("nope"))
            with pytest.raises(SessionClosedError, match="session S1 is closed"):
                await store.accept(instruction("S1"))
            assert await store.counts() == {}
            assert (await store.get_session("S1")).turns == 0

    async def test_accept_with_claim(self, open_store: StoreFactory) -> None:
        """claim_for claims the new turn at once: token 1, the owner set, the lease ahead."""
        async with open_store() as store:
            await session(store)
            accepted = await store.accept(instruction(), claim_for="A", lease_ms=LEASE_MS)
            claim = accepted.claim
            assert claim is not None
            assert (claim.owner, claim.token, claim.turn_id) == ("A", 1, accepted.turn.turn_id)
            assert claim.lease_until_us > accepted.turn.accepted_us
            assert (accepted.turn.owner, accepted.turn.token) == ("A", 1)
            assert await store.claim("B", limit=10, lease_ms=LEASE_MS) == []

    # -- claims -----------------------------------------------------------------------------

    async def test_claim_takes_oldest_first_up_to_limit(self, open_store: StoreFactory) -> None:
        """claim takes accepted turns nobody holds, oldest first, at most limit."""
        async with open_store() as store:
            await session(store)
            ids = [(await store.accept(instruction())).turn.turn_id for _ in range(3)]
            first = await store.claim("A", limit=2, lease_ms=LEASE_MS)
            assert [c.turn_id for c in first] == ids[:2]
            assert all(c.owner == "A" and c.token == 1 for c in first)
            assert all(c.turn.owner == "A" for c in first)
            rest = await store.claim("B", limit=5, lease_ms=LEASE_MS)
            assert [c.turn_id for c in rest] == ids[2:]
            assert await store.claim("C", limit=5, lease_ms=LEASE_MS) == []
            assert await store.claim("C", limit=0, lease_ms=LEASE_MS) == []

    async def test_claim_skips_escalated_and_final(self, open_store: StoreFactory) -> None:
        """Escalated and final turns are never claimed."""
        async with open_store() as store:
            await session(store)
            await escalated(store)
            done = await claimed(store)
            await store.finish(done, TurnEnding(state=TurnState.CANCELLED))
            assert await store.claim("B", limit=10, lease_ms=SHORT_LEASE_MS) == []

    async def test_claim_waits_for_backoff(self, open_store: StoreFactory) -> None:
        """A released waiting_retry turn is claimable only once its next attempt is due."""
        async with open_store() as store:
            await session(store)
            later, due = await claimed(store), await claimed(store)
            for claim, when in ((later, 2**62), (due, 1)):
                running = await store.start_attempt(claim, attempt(1))
                waiting = await store.record_attempt(
                    running, attempt(1, decision="RETRY"), next_attempt_us=when
                )
                assert waiting.turn.state is TurnState.WAITING_RETRY
                assert waiting.turn.next_attempt_us == when
                await store.release(waiting)
            taken = await store.claim("B", limit=10, lease_ms=LEASE_MS)
            assert [c.turn_id for c in taken] == [due.turn_id]
            assert taken[0].token == 2
            assert taken[0].turn.state is TurnState.WAITING_RETRY

    async def test_claim_filter(self, open_store: StoreFactory) -> None:
        """ClaimFilter limits instruction turns by command type, process turns by session, and
        turns of any kind to the sessions a daemon homes."""
        async with open_store() as store:
            await session(store)
            await session(store, "S2")
            read = (await store.accept(instruction(command="READ"))).turn.turn_id
            write = (await store.accept(instruction(command="CLICK"))).turn.turn_id
            proc1 = (await store.accept(process("S1"))).turn.turn_id
            proc2 = (await store.accept(process("S2"))).turn.turn_id
            lease = LEASE_MS

            async def take(only: ClaimFilter) -> list[int]:
                return [
                    c.turn_id for c in await store.claim("A", limit=9, lease_ms=lease, only=only)
                ]

            none: frozenset[str] = frozenset()
            assert await take(
                ClaimFilter(command_types=frozenset({"CLICK"}), process_sessions=none)
            ) == [write]
            assert await take(
                ClaimFilter(command_types=none, process_sessions=frozenset({"S2"}))
            ) == [proc2]
            s2_read = (await store.accept(instruction("S2", command="READ"))).turn.turn_id
            assert await take(ClaimFilter(sessions=frozenset({"S2"}))) == [s2_read]
            assert await take(ClaimFilter(kinds=frozenset({TurnKind.PROCESS}))) == [proc1]
            assert await take(ClaimFilter(kinds=frozenset({TurnKind.PROCESS}))) == []
            assert await take(ClaimFilter()) == [read]

    async def test_expired_lease_is_taken_over(self, open_store: StoreFactory) -> None:
        """A turn whose lease expired is claimed again with a larger token, even running."""
        async with open_store() as store:
            await session(store)
            accepted = await store.accept(instruction(), claim_for="A", lease_ms=SHORT_LEASE_MS)
            assert accepted.claim is not None
            running = await store.start_attempt(accepted.claim, attempt(1))
            await expire()
            (taken,) = await store.claim("B", limit=10, lease_ms=LEASE_MS)
            assert (taken.owner, taken.token) == ("B", running.token + 1)
            assert taken.turn.state is TurnState.RUNNING
            assert taken.turn.attempts == (attempt(1),)
            assert await store.claim("C", limit=10, lease_ms=LEASE_MS) == []

    async def test_stale_writes_refused_after_takeover(self, open_store: StoreFactory) -> None:
        """After a takeover every write under the old claim raises and changes nothing."""
        async with open_store() as store:
            await session(store)
            accepted = await store.accept(instruction(), claim_for="A", lease_ms=SHORT_LEASE_MS)
            assert accepted.claim is not None
            old = await store.start_attempt(accepted.claim, attempt(1))
            await expire()
            (new,) = await store.claim("B", limit=1, lease_ms=LEASE_MS)
            before = await store.get_turn(new.turn_id)
            refused_before = store.statistics().stale_writes_refused
            with pytest.raises(StaleClaimError, match=r"claim of A \(token 1\) is stale") as err:
                await store.finish(
                    old, TurnEnding(state=TurnState.SUCCEEDED), [attempt(1, decision="X")]
                )
            assert (err.value.turn_id, err.value.token, err.value.current_token) == (
                new.turn_id,
                1,
                2,
            )
            with pytest.raises(StaleClaimError):
                await store.record_attempt(old, attempt(1, decision="RETRY"), next_attempt_us=1)
            with pytest.raises(StaleClaimError):
                await store.start_attempt(old, attempt(2))
            assert await store.renew([old], lease_ms=LEASE_MS) == []
            await store.release(old)  # a lost claim has nothing to give up
            unchanged(before, await store.get_turn(new.turn_id))
            assert store.statistics().stale_writes_refused == refused_before + 3

    async def test_write_without_owner_is_stale(self, open_store: StoreFactory) -> None:
        """A released or finished turn refuses writes under the claim that held it."""
        async with open_store() as store:
            await session(store)
            claim = await claimed(store)
            await store.release(claim)
            with pytest.raises(StaleClaimError):
                await store.start_attempt(claim, attempt(1))
            (again,) = await store.claim("A", limit=1, lease_ms=LEASE_MS)
            assert again.token == claim.token + 1
            await store.finish(again, TurnEnding(state=TurnState.CANCELLED))
            with pytest.raises(StaleClaimError):
                await store.finish(again, TurnEnding(state=TurnState.CANCELLED))

    async def test_renew(self, open_store: StoreFactory) -> None:
        """renew extends the leases still held and leaves out the lost ones."""
        async with open_store() as store:
            await session(store)
            kept = await claimed(store)
            lost = await claimed(store)
            await store.release(lost)
            renewed = await store.renew([kept, lost], lease_ms=LEASE_MS * 2)
            assert [c.turn_id for c in renewed] == [kept.turn_id]
            assert renewed[0].token == kept.token
            assert renewed[0].lease_until_us > kept.lease_until_us
            await store.start_attempt(renewed[0], attempt(1))  # still a valid claim

    async def test_release_keeps_state(self, open_store: StoreFactory) -> None:
        """release gives a turn up without changing its state; another daemon claims it."""
        async with open_store() as store:
            await session(store)
            running = await store.start_attempt(await claimed(store), attempt(1))
            await store.release(running)
            released = await store.get_turn(running.turn_id)
            assert released.state is TurnState.RUNNING
            assert released.owner is None
            (taken,) = await store.claim("B", limit=1, lease_ms=LEASE_MS)
            assert (taken.turn_id, taken.token) == (running.turn_id, running.token + 1)

    # -- fenced writes and the lifecycle ----------------------------------------------------

    async def test_attempts_to_success(self, open_store: StoreFactory) -> None:
        """start, record a retry, start again, finish: states, attempts and result recorded."""
        async with open_store() as store:
            await session(store)
            claim = await claimed(store)
            run1 = await store.start_attempt(claim, attempt(1, trace={"x": [1, 2]}))
            assert (run1.turn.state, run1.turn.attempt, run1.token) == (TurnState.RUNNING, 1, 1)
            assert run1.turn.attempts == (attempt(1, trace={"x": [1, 2]}),)
            wait = await store.record_attempt(run1, attempt(1, decision="RETRY"), next_attempt_us=5)
            assert wait.turn.state is TurnState.WAITING_RETRY
            assert wait.turn.attempts == (attempt(1, decision="RETRY"),)
            run2 = await store.start_attempt(wait, attempt(2))
            assert run2.turn.next_attempt_us is None
            ending = TurnEnding(
                state=TurnState.SUCCEEDED, verdict="SUCCEED", reason_code="ok", result={"n": 2}
            )
            done = await store.finish(run2, ending, [attempt(2, decision="SUCCEED")])
            assert done.state is TurnState.SUCCEEDED
            assert done.final
            assert done.finished_us is not None
            assert (done.verdict, done.reason_code, done.owner) == ("SUCCEED", "ok", None)
            assert done.result == {"n": 2}
            assert done.attempt == 2
            assert done.attempts == (attempt(1, decision="RETRY"), attempt(2, decision="SUCCEED"))
            assert await store.get_turn(done.turn_id) == done

    async def test_illegal_moves_refused(self, open_store: StoreFactory) -> None:
        """A move the lifecycle forbids raises IllegalTransition naming both states."""
        async with open_store() as store:
            await session(store)
            claim = await claimed(store)
            before = await store.get_turn(claim.turn_id)
            with pytest.raises(IllegalTransition, match="from accepted to succeeded"):
                await store.finish(
                    claim, TurnEnding(state=TurnState.SUCCEEDED), [attempt(1, decision="X")]
                )
            with pytest.raises(IllegalTransition, match="from accepted to waiting_retry"):
                await store.record_attempt(claim, attempt(1), next_attempt_us=1)
            running = await store.start_attempt(claim, attempt(1))
            with pytest.raises(IllegalTransition, match="from running to running"):
                await store.start_attempt(running, attempt(2))
            unchanged(running.turn, await store.get_turn(claim.turn_id))
            assert before.attempts == ()

    async def test_finish_needs_final_or_escalated(self, open_store: StoreFactory) -> None:
        """finish refuses a state that is neither final nor escalated."""
        async with open_store() as store:
            await session(store)
            running = await store.start_attempt(await claimed(store), attempt(1))
            with pytest.raises(ValueError, match="waiting_retry"):
                await store.finish(running, TurnEnding(state=TurnState.WAITING_RETRY))
            unchanged(running.turn, await store.get_turn(running.turn_id))

    # -- escalations ------------------------------------------------------------------------

    async def test_escalation_releases_claim(self, open_store: StoreFactory) -> None:
        """finish to escalated parks the turn and releases its claim."""
        async with open_store() as store:
            await session(store)
            parked = await escalated(store)
            assert parked.state is TurnState.ESCALATED
            assert parked.owner is None
            assert not parked.final
            assert parked.finished_us is None

    async def test_resolve_retry_gives_fresh_budget(self, open_store: StoreFactory) -> None:
        """RETRY puts the turn back to accepted, attempt 0, claimable; old attempts stay."""
        async with open_store() as store:
            await session(store)
            parked = await escalated(store)
            retried = await store.resolve_escalation(parked.turn_id, Resolution.RETRY)
            assert (retried.state, retried.attempt, retried.owner) == (TurnState.ACCEPTED, 0, None)
            assert retried.attempts == parked.attempts
            (claim,) = await store.claim("B", limit=1, lease_ms=LEASE_MS)
            assert claim.token == parked.token + 1
            run = await store.start_attempt(claim, attempt(1))  # numbered from 1 again
            assert run.turn.attempt == 1
            done = await store.finish(
                run, TurnEnding(state=TurnState.SUCCEEDED), [attempt(1, decision="SUCCEED")]
            )
            assert done.attempts == (
                attempt(1, decision="ESCALATE"),
                attempt(1, decision="SUCCEED"),
            )

    @pytest.mark.parametrize(
        ("resolution", "state"),
        [(Resolution.TERMINATE, TurnState.TERMINATED), (Resolution.CANCEL, TurnState.CANCELLED)],
    )
    async def test_resolve_ends_turn(
        self, open_store: StoreFactory, resolution: Resolution, state: TurnState
    ) -> None:
        """TERMINATE and CANCEL end an escalated turn for good."""
        async with open_store() as store:
            await session(store)
            parked = await escalated(store)
            ended = await store.resolve_escalation(parked.turn_id, resolution)
            assert ended.state is state
            assert ended.final
            assert ended.finished_us is not None
            assert ended.attempts == parked.attempts
            assert (ended.reason_code, ended.reason) == RESOLUTION_REASONS[resolution]
            with pytest.raises(NotEscalatedError, match=f"is {state.value}, not escalated"):
                await store.resolve_escalation(parked.turn_id, Resolution.RETRY)

    async def test_resolve_needs_escalated_turn(self, open_store: StoreFactory) -> None:
        """Resolving a turn that is not parked raises NotEscalatedError; unknown ids raise."""
        async with open_store() as store:
            await session(store)
            turn = (await store.accept(instruction())).turn
            with pytest.raises(NotEscalatedError, match="is accepted, not escalated") as err:
                await store.resolve_escalation(turn.turn_id, Resolution.TERMINATE)
            assert err.value.state == "accepted"
            unchanged(turn, await store.get_turn(turn.turn_id))
            with pytest.raises(UnknownTurnError):
                await store.resolve_escalation(10_000, Resolution.RETRY)

    # -- recovery ---------------------------------------------------------------------------

    async def test_recover_claims_unfinished(self, open_store: StoreFactory) -> None:
        """recover takes back every unfinished, non-escalated turn its owner held, and those
        nobody holds, each with a larger token: the old claims are stale."""
        async with open_store() as store:
            await session(store)
            fresh = (await store.accept(instruction())).turn
            running = await store.start_attempt(await claimed(store), attempt(1))
            waiting = await store.record_attempt(
                await store.start_attempt(await claimed(store), attempt(1)),
                attempt(1, decision="RETRY"),
                next_attempt_us=2**62,
            )
            await escalated(store)
            await store.finish(await claimed(store), TurnEnding(state=TurnState.REJECTED))
            got = await store.recover("A", lease_ms=LEASE_MS)
            assert [c.turn_id for c in got] == [fresh.turn_id, running.turn_id, waiting.turn_id]
            assert [c.token for c in got] == [1, 2, 2]
            assert {c.owner for c in got} == {"A"}
            assert got[1].turn.state is TurnState.RUNNING
            assert got[1].turn.attempts == (attempt(1),)
            with pytest.raises(StaleClaimError):
                await store.finish(running, TurnEnding(state=TurnState.FAILED))

    async def test_state_survives_reopen(self, open_store: StoreFactory) -> None:
        """What a store returned is there after a restart; tokens keep growing."""
        async with open_store() as store:
            await session(store)
            running = await store.start_attempt(await claimed(store), attempt(1))
            idle = (await store.accept(instruction(key="k"))).turn
        async with open_store() as store:
            assert (await store.get_turn(running.turn_id)).attempts == (attempt(1),)
            assert await store.find_turn("S1", "k") == idle
            got = await store.recover("A", lease_ms=LEASE_MS)
            assert [(c.turn_id, c.token) for c in got] == [(running.turn_id, 2), (idle.turn_id, 1)]
            assert (await store.get_session("S1")).turns == 2

    # -- reads ------------------------------------------------------------------------------

    async def test_list_turns_pages(self, open_store: StoreFactory) -> None:
        """list_turns pages by turn_id and filters by session and state."""
        async with open_store() as store:
            await session(store)
            await session(store, "S2")
            ids = [(await store.accept(instruction("S1"))).turn.turn_id for _ in range(5)]
            other = (await store.accept(instruction("S2"))).turn.turn_id
            await store.finish(await claimed(store), TurnEnding(state=TurnState.CANCELLED))
            seen: list[int] = []
            after = 0
            while True:
                page = await store.list_turns(session_id="S1", after_turn_id=after, limit=2)
                seen.extend(t.turn_id for t in page.turns)
                assert len(page.turns) <= 2
                if page.next_after is None:
                    break
                after = page.next_after
            assert seen[:5] == ids
            assert len(seen) == 6
            everything = await store.list_turns()
            assert other in [t.turn_id for t in everything.turns]
            assert everything.next_after is None
            cancelled = await store.list_turns(states=frozenset({TurnState.CANCELLED}))
            assert [t.state for t in cancelled.turns] == [TurnState.CANCELLED]
            exact = await store.list_turns(session_id="S2", limit=1)
            assert ([t.turn_id for t in exact.turns], exact.next_after) == ([other], None)

    async def test_list_turns_of_interleaved_sessions(self, open_store: StoreFactory) -> None:
        """The turns of sessions accepted together (one pass, keyed and not) list per session:
        each session's own, in order, numbered 1..n; a session without turns lists none, and
        the same key in two sessions makes two turns."""
        async with open_store() as store:
            names = ["A", "B", "C", "EMPTY"]
            for name in names:
                await session(store, name)
            got: dict[str, list[int]] = {"A": [], "B": [], "C": []}

            async def take(name: str, i: int) -> None:
                key = f"k{i}" if i % 2 else None
                got[name].append((await store.accept(instruction(name, key=key, i=i))).turn.turn_id)

            for round_ in range(3):
                async with anyio.create_task_group() as tg:
                    for i in range(4):
                        for name in got:
                            tg.start_soon(take, name, round_ * 4 + i)
            for name, ids in got.items():
                listed = (await store.list_turns(session_id=name)).turns
                assert [t.turn_id for t in listed] == sorted(ids)
                assert [t.turn_number for t in listed] == list(range(1, 13))
                assert {t.session_id for t in listed} == {name}
                page = await store.list_turns(session_id=name, after_turn_id=sorted(ids)[5])
                assert [t.turn_id for t in page.turns] == sorted(ids)[6:]
            assert (await store.list_turns(session_id="EMPTY")).turns == ()
            assert (await store.list_turns(session_id="NOBODY")).turns == ()
            again = await store.accept(instruction("A", key="k1", i=1))
            assert (again.created, again.turn.session_id) == (False, "A")
            assert (await store.get_session("A")).turns == 12

    async def test_list_turns_filters(self, open_store: StoreFactory) -> None:
        """list_turns keeps the turns of a package's sessions, of some states, accepted in a
        time window; the given filters all hold, and pages follow them."""
        async with open_store() as store:
            await session(store)
            await store.open_session(NewSession(session_id="S2", package_id="other"))
            first = (await store.accept(instruction("S1"))).turn
            cancelled = await store.finish(
                await claimed(store, instruction("S2")), TurnEnding(state=TurnState.CANCELLED)
            )
            last = (await store.accept(instruction("S2"))).turn
            mine = await store.list_turns(package_id="other")
            assert [t.turn_id for t in mine.turns] == [cancelled.turn_id, last.turn_id]
            assert (await store.list_turns(package_id="none")).turns == ()
            since = last.accepted_us
            kept = await store.list_turns(accepted_since_us=since)
            everything = (await store.list_turns()).turns
            assert [t.turn_id for t in kept.turns] == [
                t.turn_id for t in everything if t.accepted_us >= since
            ]
            before = await store.list_turns(accepted_until_us=since)
            assert last.turn_id not in [t.turn_id for t in before.turns]
            assert [t.turn_id for t in before.turns] == [
                t.turn_id for t in everything if t.accepted_us < since
            ]
            window = await store.list_turns(
                accepted_since_us=first.accepted_us, accepted_until_us=first.accepted_us + 1
            )
            assert first.turn_id in [t.turn_id for t in window.turns]
            both = await store.list_turns(
                package_id="other", states=frozenset({TurnState.ACCEPTED})
            )
            assert [t.turn_id for t in both.turns] == [last.turn_id]
            page = await store.list_turns(package_id="other", limit=1)
            assert ([t.turn_id for t in page.turns], page.next_after) == (
                [cancelled.turn_id],
                cancelled.turn_id,
            )
            rest = await store.list_turns(package_id="other", after_turn_id=cancelled.turn_id)
            assert ([t.turn_id for t in rest.turns], rest.next_after) == ([last.turn_id], None)

    async def test_counts(self, open_store: StoreFactory) -> None:
        """counts gives the number of turns per state value (states with none left out)."""
        async with open_store() as store:
            await session(store)
            assert await store.counts() == {}
            await store.accept(instruction())
            await store.accept(instruction())
            await store.start_attempt(await claimed(store), attempt(1))
            assert await store.counts() == {"accepted": 2, "running": 1}

    async def test_unknown_turn(self, open_store: StoreFactory) -> None:
        """get_turn of an id never given raises UnknownTurnError naming it."""
        async with open_store() as store:
            with pytest.raises(UnknownTurnError, match="unknown turn 4242"):
                await store.get_turn(4242)

    # -- batches and closing ----------------------------------------------------------------

    async def test_concurrent_accepts_get_their_own_turns(self, open_store: StoreFactory) -> None:
        """Many accepts at once each get their own turn, number and claim."""
        results: dict[int, tuple[int, TurnSpec, Claim | None]] = {}
        async with open_store() as store:
            await session(store)

            async def one(i: int) -> None:
                got = await store.accept(instruction(i=i), claim_for=f"o{i}", lease_ms=LEASE_MS)
                results[i] = (got.turn.turn_number, got.turn.spec, got.claim)

            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(one, i)
            assert sorted(n for n, _, _ in results.values()) == list(range(1, 51))
            for i, (_, turn_spec, claim) in results.items():
                assert isinstance(turn_spec, InstructionSpec)
                assert turn_spec.parameters["i"] == i
                assert claim is not None
                assert claim.owner == f"o{i}"
            assert (await store.get_session("S1")).turns == 50

    async def test_failing_op_spares_its_neighbours(self, open_store: StoreFactory) -> None:
        """In a batch, each failing call raises to its own caller; the others commit."""
        async with open_store() as store:
            await session(store)
            stale = await claimed(store)
            await store.release(stale)
            outcomes: dict[str, object] = {}

            async def run(name: str, call: Callable[[], Awaitable[object]]) -> None:
                try:
                    outcomes[name] = await call()
                except Exception as exc:  # the outcome under test
                    outcomes[name] = exc

            calls: dict[str, Callable[[], Awaitable[object]]] = {
                "ok1": lambda: store.accept(instruction(key="a")),
                "unknown": lambda: store.accept(instruction("nope")),
                "ok2": lambda: store.open_session(NewSession(session_id="S3", package_id="p")),
                "dup": lambda: store.open_session(NewSession(session_id="S1", package_id="p")),
                "stale": lambda: store.start_attempt(stale, attempt(1)),
                "ok3": lambda: store.accept(instruction(key="b")),
            }
            async with anyio.create_task_group() as tg:
                for name, call in calls.items():
                    tg.start_soon(run, name, call)
            assert isinstance(outcomes["unknown"], UnknownSessionError)
            assert isinstance(outcomes["dup"], ValueError)
            assert isinstance(outcomes["stale"], StaleClaimError)
            assert (await store.get_session("S3")).package_id == "p"
            assert await store.find_turn("S1", "a") is not None
            assert await store.find_turn("S1", "b") is not None
            assert (await store.get_turn(stale.turn_id)).state is TurnState.ACCEPTED

    async def test_endings_queued_together_each_get_their_own_outcome(
        self, open_store: StoreFactory
    ) -> None:
        """Endings queued in one pass (`finish_soon`, the turn core's batch) commit together:
        a stale one and an illegal one are refused alone (they write nothing), each other
        one's record is the turn as the store reads it back, with its attempt and its line."""
        async with open_store() as store:
            await session(store)
            claims = [await claimed(store) for _ in range(6)]
            claims[1] = await store.start_attempt(claims[1], attempt(1))  # its start written
            stale = Claim(
                turn=claims[2].turn,
                owner=claims[2].owner,
                token=claims[2].token + 1,
                lease_until_us=claims[2].lease_until_us,
            )
            done = TurnEnding(state=TurnState.SUCCEEDED, verdict="SUCCEED", reason_code="ok")
            pending = [
                store.finish_soon(
                    stale if i == 2 else claim,
                    replace(done, result={"n": i}),
                    [attempt(1, decision="SUCCEED")],
                    ledger_lines=[line("L1", i + 1)],
                    # 1: its start was written; 4: never started (accepted -> succeeded)
                    started=None if i in (1, 4) else attempt(1),
                )
                for i, claim in enumerate(claims)
            ]
            outcomes: dict[int, object] = {}
            for i, item in enumerate(pending):
                try:
                    outcomes[i] = await item.result()
                except Exception as exc:  # the outcome under test
                    outcomes[i] = exc
            assert isinstance(outcomes[2], StaleClaimError)
            assert isinstance(outcomes[4], IllegalTransition)
            for i in (2, 4):
                assert (await store.get_turn(claims[i].turn_id)).state is TurnState.ACCEPTED
            for i in (0, 1, 3, 5):
                record = outcomes[i]
                assert isinstance(record, TurnRecord)
                assert record == await store.get_turn(claims[i].turn_id)
                assert record.state is TurnState.SUCCEEDED
                assert record.result == {"n": i}
                assert [a.decision for a in record.attempts] == ["SUCCEED"]
                assert record.owner is None
            kept = await store.ledger_lines(["L1"])
            assert [x.seq for x in kept] == [1, 2, 4, 6]
            assert (await store.get_session("S1")).turns == 6

    async def test_an_ending_whose_line_differs_is_refused_alone(
        self, open_store: StoreFactory
    ) -> None:
        """Among endings queued together, one whose ledger line differs from the line kept at
        its seq is refused (ValueError) and writes nothing; the others commit."""
        async with open_store() as store:
            await session(store)
            done = TurnEnding(state=TurnState.SUCCEEDED, verdict="SUCCEED", reason_code="ok")
            first = await claimed(store)
            await store.finish(
                first,
                done,
                [attempt(1, decision="SUCCEED")],
                ledger_lines=[line("L2", 1)],
                started=attempt(1),
            )
            claims = [await claimed(store) for _ in range(3)]
            lines = [line("L2", 2), line("L2", 1, salt="forked"), line("L2", 3)]
            pending = [
                store.finish_soon(
                    c, done, [attempt(1, decision="SUCCEED")], ledger_lines=[x], started=attempt(1)
                )
                for c, x in zip(claims, lines, strict=True)
            ]
            outcomes: list[object] = []
            for p in pending:
                try:
                    outcomes.append(await p.result())
                except Exception as exc:  # the outcome under test
                    outcomes.append(exc)
            assert isinstance(outcomes[1], ValueError)
            assert (await store.get_turn(claims[1].turn_id)).state is TurnState.ACCEPTED
            assert all(isinstance(outcomes[i], TurnRecord) for i in (0, 2))
            kept = await store.ledger_lines(["L2"])
            assert [(x.seq, x.entry_hash) for x in kept] == [
                (1, line("L2", 1).entry_hash),
                (2, line("L2", 2).entry_hash),
                (3, line("L2", 3).entry_hash),
            ]

    async def test_accepts_queued_together_each_get_their_own_outcome(
        self, open_store: StoreFactory
    ) -> None:
        """Accepts arriving in one pass (the turn core's batch): each turn gets its own id and
        the next number of its session, a keyed one among them too; those of a closed or an
        unknown session are refused alone; each record is the turn as the store reads it."""
        async with open_store() as store:
            await session(store)
            await session(store, "S2")
            await session(store, "S3")
            await store.close_session("S3")
            news = [
                instruction(),
                instruction("S2"),
                instruction("S3"),
                instruction(key="k"),
                instruction("nope"),
                instruction(),
                instruction("S2"),
                process(),
            ]
            outcomes: dict[int, object] = {}

            async def one(i: int) -> None:
                try:
                    outcomes[i] = await store.accept(news[i], claim_for="A", lease_ms=LEASE_MS)
                except Exception as exc:  # the outcome under test
                    outcomes[i] = exc

            async with anyio.create_task_group() as tg:
                for i in range(len(news)):
                    tg.start_soon(one, i)
            assert isinstance(outcomes[2], SessionClosedError)
            assert isinstance(outcomes[4], UnknownSessionError)
            numbers: dict[str, list[int]] = {}
            for i in (0, 1, 3, 5, 6, 7):
                got = outcomes[i]
                assert isinstance(got, Accepted)
                assert got.created
                assert got.claim is not None
                assert got.claim.owner == "A"
                assert got.turn == await store.get_turn(got.turn.turn_id)
                assert got.turn.spec == news[i].spec
                numbers.setdefault(got.turn.session_id, []).append(got.turn.turn_number)
            assert sorted(numbers["S1"]) == [1, 2, 3, 4]
            assert sorted(numbers["S2"]) == [1, 2]
            assert (await store.get_session("S1")).turns == 4
            assert (await store.get_session("S3")).turns == 0
            again = await store.accept(instruction(key="k"))
            assert not again.created

    async def test_closed_store_raises(self, open_store: StoreFactory) -> None:
        """After aclose every call raises IntakeClosedError."""
        async with open_store() as store:
            await session(store)
            await store.aclose()
            with pytest.raises(IntakeClosedError):
                await store.accept(instruction())
            with pytest.raises(IntakeClosedError):
                await store.get_session("S1")
        with pytest.raises(IntakeClosedError):
            await store.counts()
        with pytest.raises(IntakeClosedError):
            await store.claim("A", limit=1, lease_ms=LEASE_MS)

    async def test_statistics(self, open_store: StoreFactory) -> None:
        """statistics counts commits and operations and names the engine."""
        async with open_store() as store:
            await session(store)
            await store.accept(instruction())
            stats = store.statistics()
            assert stats.engine
            assert stats.operations >= 2
            assert 1 <= stats.commits <= stats.operations
            assert stats.largest_batch >= 1
            assert stats.stale_writes_refused == 0

    # -- ledger lines ride in the ending's commit ---------------------------------------------

    async def test_finish_keeps_ledger_lines(self, open_store: StoreFactory) -> None:
        """The ending's ledger lines commit with it, survive a restart, come back in
        (ledger, seq) order and go once trimmed."""
        lines = [line("S1/exec", 2), line("S1/evidence", 2), line("S1/exec", 3)]
        async with open_store() as store:
            await session(store)
            held = await claimed(store)
            held = await store.start_attempt(held, attempt(1))
            await store.finish(held, TurnEnding(state=TurnState.SUCCEEDED), ledger_lines=lines[:2])
            escalated_turn = await escalated(store)
            await store.resolve_escalation(
                escalated_turn.turn_id, Resolution.TERMINATE, ledger_lines=lines[2:]
            )
        async with open_store() as store:
            got = await store.ledger_lines(["S1/exec", "S1/evidence", "S2/exec"])
            assert got == [lines[0], lines[2], lines[1]]
            if store.keeps_ledgers:  # the ledger of record: nothing is ever dropped
                assert await store.trim_ledger_lines({"S1/exec": 2, "S1/evidence": 5}) == 0
                assert await store.ledger_lines(["S1/exec", "S1/evidence"]) == got
            else:
                assert await store.trim_ledger_lines({"S1/exec": 2, "S1/evidence": 5}) == 2
                assert await store.ledger_lines(["S1/exec", "S1/evidence"]) == [lines[2]]
            assert await store.trim_ledger_lines({}) == 0

    async def test_refused_finish_keeps_no_lines(self, open_store: StoreFactory) -> None:
        """A stale or illegal ending keeps none of its lines; a different line under a kept
        seq (a forked chain) is refused and changes nothing."""
        async with open_store() as store:
            await session(store)
            accepted = await store.accept(instruction(), claim_for="A", lease_ms=SHORT_LEASE_MS)
            assert accepted.claim is not None
            old = await store.start_attempt(accepted.claim, attempt(1))
            await expire()
            (new,) = await store.claim("B", limit=1, lease_ms=LEASE_MS)
            with pytest.raises(StaleClaimError):
                await store.finish(
                    old, TurnEnding(state=TurnState.SUCCEEDED), ledger_lines=[line("S1/exec", 2)]
                )
            fresh = await claimed(store)
            with pytest.raises(IllegalTransition):  # accepted cannot succeed without running
                await store.finish(
                    fresh,
                    TurnEnding(state=TurnState.SUCCEEDED),
                    ledger_lines=[line("S1/exec", 2)],
                )
            assert await store.ledger_lines(["S1/exec"]) == []
            await store.finish(  # the new owner's claim of the running turn
                new, TurnEnding(state=TurnState.SUCCEEDED), ledger_lines=[line("S1/exec", 2)]
            )
            other = await claimed(store)
            other = await store.start_attempt(other, attempt(1))
            with pytest.raises(ValueError, match="different line at seq 2"):
                await store.finish(
                    other,
                    TurnEnding(state=TurnState.SUCCEEDED),
                    ledger_lines=[line("S1/exec", 2, salt="forked")],
                )
            assert (await store.get_turn(other.turn_id)).state is TurnState.RUNNING
            assert await store.ledger_lines(["S1/exec"]) == [line("S1/exec", 2)]

    async def test_start_attempt_soon_commits_in_order(self, open_store: StoreFactory) -> None:
        """A queued start commits before any later write (a finish written right after it is
        legal), calls back once durable, and a refused one raises from `result` only."""
        async with open_store() as store:
            await session(store)
            held = await claimed(store)
            seen: list[Claim] = []
            pending = store.start_attempt_soon(held, attempt(1), on_commit=seen.append)
            done = await store.finish(held, TurnEnding(state=TurnState.SUCCEEDED))
            assert done.state is TurnState.SUCCEEDED
            started = await pending.result()
            assert [c.turn.state for c in seen] == [TurnState.RUNNING]
            assert started.turn.attempt == 1
            refused = store.start_attempt_soon(held, attempt(2), on_commit=seen.append)
            with pytest.raises(StaleClaimError):
                await refused.result()
            assert len(seen) == 1

    async def test_outcome_writes_carry_an_unwritten_start(self, open_store: StoreFactory) -> None:
        """`finish` and `record_attempt` with ``started``: the start and the outcome in one
        write (accepted -> running -> outcome); refused whole under a stale claim."""
        async with open_store() as store:
            await session(store)
            held = await claimed(store)
            waiting = await store.record_attempt(
                held, attempt(1, decision="RETRY"), next_attempt_us=1, started=attempt(1)
            )
            assert waiting.turn.state is TurnState.WAITING_RETRY
            done = await store.finish(
                waiting,
                TurnEnding(state=TurnState.SUCCEEDED),
                [attempt(2, decision="SUCCEED")],
                started=attempt(2),
            )
            assert done.state is TurnState.SUCCEEDED
            assert [(a.attempt, a.decision) for a in done.attempts] == [
                (1, "RETRY"),
                (2, "SUCCEED"),
            ]
            accepted = await store.accept(instruction(), claim_for="A", lease_ms=SHORT_LEASE_MS)
            assert accepted.claim is not None
            await expire()
            await store.claim("B", limit=1, lease_ms=LEASE_MS)
            with pytest.raises(StaleClaimError):
                await store.finish(
                    accepted.claim, TurnEnding(state=TurnState.SUCCEEDED), started=attempt(1)
                )
            after = await store.get_turn(accepted.turn.turn_id)
            assert (after.state, after.attempts) == (TurnState.ACCEPTED, ())
