"""The argument checks and request shapes both engines' facades share, before any SQL.

A lease must not be negative; a listing needs a positive page size and its filter.
Apart from the engines because these are rules of the `TurnStore` seam, not of a database:
written once, so the two facades cannot drift.
"""

from __future__ import annotations

from sandbox.policy.lifecycle import TurnState
from supervisor.store.turn_filter import TurnFilter

__all__ = ["check_lease", "turn_filter"]


def check_lease(lease_ms: int) -> None:
    """ValueError for a negative lease."""
    if lease_ms < 0:
        raise ValueError(f"lease_ms must not be negative, got {lease_ms}")


def turn_filter(
    *,
    session_id: str | None,
    states: frozenset[TurnState] | None,
    package_id: str | None,
    accepted_since_us: int | None,
    accepted_until_us: int | None,
    limit: int,
) -> TurnFilter:
    """The filter of a `TurnStore.list_turns` call; ValueError for a page size under one."""
    if limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    return TurnFilter(
        session_id=session_id,
        states=states,
        package_id=package_id,
        accepted_since_us=accepted_since_us,
        accepted_until_us=accepted_until_us,
    )
