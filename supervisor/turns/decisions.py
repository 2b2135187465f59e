"""Who decided: a person's decision taken through the control API, attributed.

``escalations.resolve``, ``turn.cancel`` and ``drain`` are decisions a person (or a program
acting for one) takes. Each is recorded with who took it and why, as a `Decision`:

* ``uid`` and ``pid``: the caller, from the control socket's peer credentials (``SO_PEERCRED``,
  recorded by the kernel at ``connect()``): the daemon adds them itself, a client cannot forge
  them (None only for a request that came through no Unix socket, e.g. an in-process call);
* ``operator``: a name the client gives (``--operator``), by default the user name of ``uid``
  (``pwd``), else ``"uid N"``: free text, attributed to ``uid``, not proven by it;
* ``reason``: why, in words (required for ``escalations.resolve``; optional, null when not
  given, for ``turn.cancel`` and ``drain``);
* ``action`` (``retry``, ``terminate``, ``cancel``, ``drain``) and ``at_us``, when.

A decision that ends a turn is sealed in the turn's evidence ledger entry as ``decided_by`` and
kept in the turn's ``result.decided_by`` (`turn.get`, `hunter turn show`); the log events of
the decision carry ``uid``, ``operator`` and ``reason`` too (docs/logging.md).
"""

from __future__ import annotations

import pwd
import time
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Decision", "operator_name"]


def operator_name(uid: int | None) -> str:
    """The user name of *uid* (``pwd``), ``"uid N"`` when it has none, ``"unknown"`` without a
    uid. May block on a remote user database: call it on a worker thread."""
    if uid is None:
        return "unknown"
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return f"uid {uid}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """One attributed decision (see the module docstring)."""

    action: str
    uid: int | None
    pid: int | None
    operator: str
    reason: str | None
    at_us: int

    @classmethod
    def now(
        cls, action: str, *, uid: int | None, pid: int | None, operator: str, reason: str | None
    ) -> Decision:
        return cls(
            action=action,
            uid=uid,
            pid=pid,
            operator=operator,
            reason=reason,
            at_us=time.time_ns() // 1000,
        )

    def to_dict(self) -> dict[str, object]:
        """``decided_by`` as recorded: in the evidence entry, the turn's result, the store."""
        return {
            "action": self.action,
            "uid": self.uid,
            "pid": self.pid,
            "operator": self.operator,
            "reason": self.reason,
            "at_us": self.at_us,
        }

    @classmethod
    def from_dict(cls, value: object) -> Decision | None:
        """A recorded ``decided_by`` back (a resolution asked of a fleet's home); None when
        *value* is not one."""
        if not isinstance(value, Mapping):
            return None
        action, uid, pid = value.get("action"), value.get("uid"), value.get("pid")
        operator, reason, at_us = value.get("operator"), value.get("reason"), value.get("at_us")
        if not (
            isinstance(action, str)
            and isinstance(operator, str)
            and isinstance(at_us, int)
            and (uid is None or isinstance(uid, int))
            and (pid is None or isinstance(pid, int))
            and (reason is None or isinstance(reason, str))
        ):
            return None
        return cls(action=action, uid=uid, pid=pid, operator=operator, reason=reason, at_us=at_us)
