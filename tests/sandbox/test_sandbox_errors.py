"""Sandbox edge exceptions carry structured fields."""

from __future__ import annotations

import pytest

from sandbox.errors import (
    CapabilityViolation,
    DeclarationError,
    ManifestError,
    PackageNotFoundError,
    SandboxUnavailableError,
    SpawnError,
)


def test_capability_violation_fields_and_dict() -> None:
    """A violation names operation, target, capability, session and turn."""
    exc = CapabilityViolation(
        operation="execute",
        target="curl",
        capability="capabilities.execute",
        session_id="SES-1",
        turn_number=2,
        detail="not allowed",
    )
    assert str(exc) == "execute 'curl' violates capabilities.execute: not allowed"
    assert exc.to_dict()["turn_number"] == 2
    assert exc.to_dict()["session_id"] == "SES-1"


def test_messages_are_built_from_fields() -> None:
    """Each error's message comes from its structured fields."""
    assert str(ManifestError(path="m", json_path="$.a", problem="bad")) == "m: $.a: bad"
    assert str(DeclarationError(field="f", problem="p")) == "f: p"
    assert str(SandboxUnavailableError(mechanisms={"landlock": "absent"})).endswith(
        "landlock: absent"
    )
    err = SpawnError(stage="execve", errno_=2, message="gone")
    assert (err.stage, err.errno) == ("execve", 2)
    with pytest.raises(LookupError, match=r"^package 'p' not found: x does not exist$"):
        raise PackageNotFoundError(package_id="p", path="x")
