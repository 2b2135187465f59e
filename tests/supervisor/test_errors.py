"""supervisor.errors: one flat module of the package's exceptions, re-exported where raised."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from sandbox.policy.envelopes import ExecutorCommandType
from supervisor import errors


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("supervisor.control.client", "ConnectionLost"),
        ("supervisor.control.client", "ControlClientError"),
        ("supervisor.control.client", "DaemonNotRunning"),
        ("supervisor.config", "ConfigError"),
        ("supervisor.executors.hub", "QueueFullError"),
        ("supervisor.wire.executor", "ProtocolError"),
        ("supervisor.turns.core", "RequestError"),
        ("supervisor.sdk", "ExecutorRejected"),
        ("supervisor.server", "DaemonAlreadyRunning"),
    ],
)
def test_old_import_locations_are_the_same_class(module: str, name: str) -> None:
    """Each exception is importable from the module that raises it, as the same class."""
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


def test_every_exception_says_when_it_is_raised() -> None:
    """Every exported exception has a docstring saying when it is raised."""
    for name in errors.__all__:
        doc = getattr(errors, name).__doc__ or ""
        assert "raised" in doc.lower(), name


def test_structured_fields() -> None:
    """Exceptions carry their fields, and their messages are built from them."""
    full = errors.QueueFullError(ExecutorCommandType.READ, 4, 250)
    assert (full.command_type, full.capacity, full.retry_after_ms) == (
        ExecutorCommandType.READ,
        4,
        250,
    )
    assert str(full) == "the READ queue is full (4 waiting); retry after 250 ms"
    running = errors.DaemonAlreadyRunning(Path("r"), 42)
    assert (running.root, running.pid) == (Path("r"), 42)
    with pytest.raises(errors.RequestError, match=r"^timeout_ms: too big$") as info:
        raise errors.RequestError("bad_request", "timeout_ms: too big", field="timeout_ms")
    assert info.value.to_wire() == {
        "code": "bad_request",
        "message": "timeout_ms: too big",
        "field": "timeout_ms",
    }
    assert errors.UnknownTurnError(7).turn_id == 7
    assert isinstance(errors.UnknownSessionError("SES-x"), errors.StoreError)
    assert errors.IntakeError is errors.StoreError  # the former name still catches them all
