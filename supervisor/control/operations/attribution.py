"""Who decided: the three decisions of the control API (``turn.cancel``,
``escalations.resolve``, ``drain``) are attributed to their caller (`supervisor.turns.decisions`).
Apart from the groups because three of them share it."""

from __future__ import annotations

import anyio.to_thread

from supervisor.executors.peercred import PeerCredentials
from supervisor.turns.decisions import Decision, operator_name

__all__ = ["caller_decision"]


async def caller_decision(
    action: str, peer: PeerCredentials | None, operator: str | None, reason: str | None
) -> Decision:
    """A decision of the caller *peer* (`supervisor.turns.decisions`): its uid and pid are the
    kernel's, the operator name the client's or, by default, the user name of that uid (looked
    up on a worker thread: a user database may be remote)."""
    uid = peer.uid if peer is not None else None
    if operator is None:
        operator = await anyio.to_thread.run_sync(operator_name, uid)
    return Decision.now(
        action,
        uid=uid,
        pid=peer.pid if peer is not None else None,
        operator=operator.strip(),
        reason=reason.strip() if reason is not None else None,
    )
