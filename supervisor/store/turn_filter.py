"""Which turns a listing keeps (``turns.list``, `TurnStore.list_turns`): one frozen value that
every engine turns into its own SQL (`supervisor.store.sqlite.turn_query`,
`supervisor.store.postgres.turn_query`). Each field is optional; the ones given all hold."""

from __future__ import annotations

from dataclasses import dataclass

from sandbox.policy.lifecycle import TurnState

__all__ = ["TurnFilter"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFilter:
    """Turns of one session, in some states, of one package's sessions, accepted in a window."""

    session_id: str | None = None
    #: any of these states (None: every state; an empty set keeps nothing)
    states: frozenset[TurnState] | None = None
    #: turns of the sessions opened for this package
    package_id: str | None = None
    #: accepted at or after this time (microseconds since the epoch)
    accepted_since_us: int | None = None
    #: accepted before this time (microseconds since the epoch)
    accepted_until_us: int | None = None

    def state_values(self) -> list[str] | None:
        """The states as their stored values, sorted (None: no state filter)."""
        return None if self.states is None else sorted(s.value for s in self.states)
