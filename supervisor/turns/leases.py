"""This daemon's leases by its own clock: no attempt, process or ending without a live lease.

A claim (a turn's) and a home (a session's, in a fleet) are leases in the shared store: another
daemon may take them over once they run out by the store's clock. A daemon that was paused (a
SIGSTOP, a VM freeze, a starved or throttled host, a GC pause) cannot tell from its own state
that this happened: the records it holds still say "mine". So it keeps its own account, by its
monotonic clock, which a pause cannot fool:

* A renewal round that succeeded proves the leases it renewed until *its start* plus the lease,
  less a margin (`LeaseClock.renewed`): the store measured the new lease from a moment no earlier
  than the round's start.
* Before an attempt or a process starts, and before an ending is queued, the daemon asks
  `LeaseClock.live`; when the account has lapsed it waits (`until_live`) for the next renewal
  round, which tells it which claims and homes it still holds. What it lost is stopped (its
  processes killed by cancellation) and refused, once (`ClaimLostError`); what it kept goes on.
* The renewal round itself notices the lapse first (`renew_claims`): it logs how late it is
  and has the fleet read its homes from the store before anything else runs.

Alone on its store (SQLite) nobody can take a lease over, so the account is not enforced there:
`LeaseClock.live` is always true.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Final

import anyio

from supervisor.errors import ClaimLostError
from supervisor.logging import get_logger
from supervisor.store.protocol import TurnStore
from supervisor.turns.tracker import ActiveTurn, Tracker

__all__ = ["LeaseClock", "renew_claims"]

#: The share of the lease kept as a margin against the store's clock and the round trip.
MARGIN_SHARE: Final = 0.25

_log = get_logger("supervisor.turns.leases")


class LeaseClock:
    """Until when, by this daemon's monotonic clock, the leases it renewed last still hold."""

    def __init__(
        self,
        lease_ms: int,
        *,
        enforced: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._enforced = enforced
        self._lease_s = lease_ms / 1000
        self._until = clock() + self._valid_s
        self._live = anyio.Event()
        self._live.set()
        #: how many times the account lapsed (the daemon was late renewing past the margin)
        self.lapses = 0

    @classmethod
    def unenforced(cls) -> LeaseClock:
        """A daemon alone on its store: nobody takes a lease over."""
        return cls(1000, enforced=False)

    @property
    def _valid_s(self) -> float:
        return self._lease_s * (1 - MARGIN_SHARE)

    def set_lease(self, lease_ms: int) -> None:
        """The configured lease changed (a reload): later renewals count with it."""
        self._lease_s = lease_ms / 1000

    def now(self) -> float:
        return self._clock()

    def live(self) -> bool:
        """The leases renewed last still hold, margin included."""
        return not self._enforced or self._clock() < self._until

    def late_s(self) -> float:
        """How far past the account's end the clock is (0 while live)."""
        return max(0.0, self._clock() - self._until) if self._enforced else 0.0

    def lapsed(self) -> None:
        """The account ran out: work waits (`until_live`) for the next successful round."""
        if self._live.is_set():
            self.lapses += 1
            self._live = anyio.Event()

    def renewed(self, started: float) -> None:
        """A renewal round that started at *started* (this clock) succeeded."""
        self._until = max(self._until, started + self._valid_s)
        if self.live():
            self._live.set()

    async def until_live(self, active: ActiveTurn) -> None:
        """Wait until the account holds again (a renewal round), then check that *active*
        still has its claim (`ClaimLostError` when a round found it lost, or it never had
        one)."""
        if not self.live():
            self.lapsed()
            await self._live.wait()
        if active.claim is None:
            raise ClaimLostError(active.turn_id, reason="its claim was lost (the lease lapsed)")

    def sleeper(
        self, active: ActiveTurn, sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    ) -> Callable[[float], Awaitable[None]]:
        """A backoff delay (the sandbox runtime's between a process turn's attempts) that
        also waits for a live lease and refuses to go on without the claim."""

        async def delay(seconds: float) -> None:
            await sleep(seconds)
            await self.until_live(active)

        return delay


async def renew_claims(
    store: TurnStore,
    tracker: Tracker,
    clock: LeaseClock,
    *,
    lease_ms: Callable[[], int],
    owner: str,
    lost: Callable[[ActiveTurn], None],
    lapsed: Callable[[float], Awaitable[None]],
) -> None:
    """Renew the turn claims this daemon holds every third of the lease, until cancelled.

    A claim the store did not renew was taken over: *lost* stops what runs it. A round that
    finds the account lapsed (the daemon was paused or starved past the margin) first calls
    *lapsed* with how late it is (the fleet reads its homes from the store), then renews."""
    while True:
        await anyio.sleep(max(0.05, lease_ms() / 3000))
        started = clock.now()
        late = clock.late_s()
        if late > 0:
            clock.lapsed()
            _log.warning("lease_lapsed", owner=owner, late_ms=round(late * 1000))
            try:
                await lapsed(late)
            except Exception as exc:  # the store is unreachable: the claims' round says more
                _log.error("lease_lapse_check_failed", owner=owner, error=str(exc))
        held = tracker.claims()
        if held:
            try:
                renewed_now = await store.renew(held, lease_ms=lease_ms())
            except Exception as exc:  # the store is unreachable: the account runs out by itself
                _log.error("lease_renewal_failed", owner=owner, error=str(exc))
                continue
            kept = {c.turn_id: c for c in renewed_now}
            # A row another transaction held through the round comes back kept but not
            # extended: the round then proves nothing new (the account keeps the last one's).
            extended = all(
                kept[c.turn_id].lease_until_us > c.lease_until_us for c in held if c.turn_id in kept
            )
            for claim in held:
                active = tracker.get(claim.turn_id)
                if active is None or active.claim is None:
                    continue
                renewed = kept.get(claim.turn_id)
                if renewed is not None:
                    if active.claim.token == renewed.token:
                        active.claim = replace(active.claim, lease_until_us=renewed.lease_until_us)
                    continue
                if active.claim is claim:  # lost meanwhile: another daemon owns it now
                    _log.warning("claim_lost", turn_id=claim.turn_id, token=claim.token)
                    lost(active)
            if not extended:
                continue
        clock.renewed(started)
