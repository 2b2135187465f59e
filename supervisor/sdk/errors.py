"""Errors of the executor SDK that ``run_executor`` raises (beside ``ExecutorRejected``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from supervisor.errors import ExecutorRejected

__all__ = ["ExecutorRejected", "WrongSocket", "is_control_answer"]


class WrongSocket(ExecutorRejected):
    """Raised by ``run_executor`` when ``socket_path`` is the daemon's control socket
    (``control.sock``, the API of ``hunter`` commands and clients) rather than its executor
    socket (``executors.sock``): the control API answered the ``hello`` with an error of its
    own. Never retried: no reconnect can fix the path. ``socket_path`` is the socket tried."""

    def __init__(self, socket_path: str, answer: Mapping[str, Any]) -> None:
        self.socket_path = socket_path
        error = answer.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        beside = os.path.join(os.path.dirname(socket_path), "executors.sock")
        where = (
            f"{beside}, beside it"
            if socket_path and os.path.exists(beside)
            else "<root>/run/executors.sock by default; the daemon's daemon_ready line names it"
        )
        super().__init__(
            "wrong_socket",
            f"{socket_path or 'the socket'} is the hunter daemon's control socket (control.sock),"
            f" not its executor socket (executors.sock): it answered hello with a control-API"
            f" error ({code or 'no code'}). Point the executor at executors.sock ({where}).",
        )


def is_control_answer(frame: Mapping[str, Any]) -> bool:
    """Whether *frame* is an answer of the control API (``{"id", "ok", ...}``, no ``type``)."""
    return "type" not in frame and isinstance(frame.get("ok"), bool)
