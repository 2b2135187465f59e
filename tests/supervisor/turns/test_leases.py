"""This daemon's leases by its own clock (`supervisor.turns.leases`): after a pause past the
margin nothing starts or ends until a renewal round says which claims still hold."""

from __future__ import annotations

import anyio
import pytest

from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.lifecycle import TurnKind, TurnState
from supervisor.errors import ClaimLostError, StaleClaimError
from supervisor.store.protocol import Claim, TurnRecord
from supervisor.turns.leases import MARGIN_SHARE, LeaseClock
from supervisor.turns.tracker import ActiveTurn
from supervisor.wire.turn_spec import InstructionSpec


class FakeClock:
    """A monotonic clock the test moves (a pause is a jump)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _turn() -> TurnRecord:
    return TurnRecord(
        turn_id=7,
        session_id="SES-x",
        turn_number=1,
        kind=TurnKind.INSTRUCTION,
        spec=InstructionSpec(
            command_type=ExecutorCommandType.READ, declared_outputs=(), timeout_ms=1000
        ),
        idempotency_key=None,
        state=TurnState.RUNNING,
        attempt=1,
        accepted_us=0,
        updated_us=0,
    )


def _active(claimed: bool = True) -> ActiveTurn:
    claim = Claim(turn=_turn(), owner="A", token=1, lease_until_us=0) if claimed else None
    return ActiveTurn(
        turn_id=7,
        session_id="SES-x",
        turn_number=1,
        kind=TurnKind.INSTRUCTION,
        state=TurnState.RUNNING,
        claim=claim,
    )


def test_a_renewal_holds_for_the_lease_less_the_margin() -> None:
    """A round that started at t proves the leases until t + lease * (1 - margin)."""
    clock = FakeClock()
    leases = LeaseClock(2000, clock=clock)
    leases.renewed(clock.now)
    clock.now += 2.0 * (1 - MARGIN_SHARE) - 0.01
    assert leases.live()
    clock.now += 0.02
    assert not leases.live()
    assert leases.late_s() == pytest.approx(0.01)


def test_alone_on_its_store_the_account_is_not_enforced() -> None:
    """Nobody can take a lease over from a daemon alone on its store."""
    leases = LeaseClock.unenforced()
    assert leases.live()
    assert leases.late_s() == 0


async def test_work_waits_for_the_next_round_after_a_pause() -> None:
    """Paused past the margin, an attempt waits; the round that renews lets it go on."""
    clock = FakeClock()
    leases = LeaseClock(2000, clock=clock)
    clock.now += 10  # a SIGSTOP of 10 s
    active = _active()
    went_on = anyio.Event()

    async def attempt() -> None:
        await leases.until_live(active)
        went_on.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(attempt)
        await anyio.wait_all_tasks_blocked()
        assert not went_on.is_set()
        assert leases.lapses == 1
        leases.renewed(clock.now)
        with anyio.fail_after(5):
            await went_on.wait()


async def test_a_claim_lost_in_the_round_refuses_the_work() -> None:
    """The round found the claim taken over: the waiting work is refused with
    `ClaimLostError` (a `StaleClaimError`: nothing of it is recorded)."""
    clock = FakeClock()
    leases = LeaseClock(2000, clock=clock)
    clock.now += 10
    active = _active()
    refused: list[BaseException] = []

    async def attempt() -> None:
        try:
            await leases.until_live(active)
        except StaleClaimError as exc:
            refused.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(attempt)
        await anyio.wait_all_tasks_blocked()
        active.claim = None  # the renewal round: lost
        leases.renewed(clock.now)
    assert len(refused) == 1
    assert isinstance(refused[0], ClaimLostError)
    assert "lease lapsed" in str(refused[0])


async def test_the_backoff_delay_of_a_process_turn_checks_the_lease() -> None:
    """Between a process turn's attempts (the runtime's backoff) the lease is checked too:
    without the claim the next attempt never starts."""
    clock = FakeClock()
    leases = LeaseClock(2000, clock=clock)
    active = _active(claimed=False)
    delay = leases.sleeper(active)
    with pytest.raises(ClaimLostError):
        await delay(0)
