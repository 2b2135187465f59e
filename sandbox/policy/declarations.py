"""The files a turn promises to write (FR-RT-013): one `DeclaredOutput` and one parser.

The daemon's intake (`supervisor/turns/requests.py`) and the sandbox runtime both parse
``declared_outputs`` here, so a declaration the intake accepts is one the runtime accepts.
Each edge turns `DeclarationProblem` into its own error (a ``bad_request`` reply, a
``DeclarationError``); the field and the problem are the same everywhere.

The rules (the stricter of the two former copies wins):

* ``declared_outputs`` is a list (``[]`` when the turn writes nothing); ``None`` is missing;
* an entry is a path string, an object ``{"path": ..., "role": ...}`` or a `DeclaredOutput`;
* ``path`` is a non-empty string, relative to ``output/<sid>`` (and to the workspace it is
  promoted into), normalised: no leading ``/``, no NUL, no empty, ``.`` or ``..`` segment (so no
  ``//`` and no trailing ``/``), at most 4096 characters, and declared once;
* ``role`` is optional and defaults to ``"output"``; when given it is a non-empty string of at
  most 200 characters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_ROLE",
    "DeclarationProblem",
    "DeclaredOutput",
    "parse_declared_outputs",
]

#: The role of an output declared without one.
DEFAULT_ROLE: Final = "output"
_MAX_PATH: Final = 4096
_MAX_ROLE: Final = 200


class DeclarationProblem(ValueError):
    """Raised by `parse_declared_outputs` for a missing or malformed declaration.

    ``field`` names the offending part (``declared_outputs``, ``declared_outputs[1].path``) and
    ``problem`` what is wrong; the message is ``"<field>: <problem>"``.
    """

    def __init__(self, *, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True, slots=True)
class DeclaredOutput:
    """A file a turn promises to write: its path relative to ``output/<sid>``, and its role."""

    path: str
    role: str = DEFAULT_ROLE

    def to_dict(self) -> dict[str, str]:
        """As recorded in the ledgers and stored in a turn's spec."""
        return {"path": self.path, "role": self.role}

    def to_wire(self) -> dict[str, str]:
        """As sent and stored on the wire (the same shape as `to_dict`)."""
        return self.to_dict()


def _path_problem(path: object) -> str | None:
    if not isinstance(path, str) or not path:
        return "required non-empty string"
    if len(path) > _MAX_PATH:
        return f"at most {_MAX_PATH} characters"
    if "\0" in path or path.startswith("/"):
        return "must be a relative path"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "must be normalised (no '', '.' or '..' segments)"
    return None


def _role_problem(role: object) -> str | None:
    if not isinstance(role, str) or not role:
        return f"must be a non-empty string (or left out for {DEFAULT_ROLE!r})"
    if len(role) > _MAX_ROLE:
        return f"at most {_MAX_ROLE} characters"
    return None


def parse_declared_outputs(
    value: object, *, field: str = "declared_outputs"
) -> tuple[DeclaredOutput, ...]:
    """Check *value* against the rules above; raise `DeclarationProblem` naming index and field."""
    if value is None:
        raise DeclarationProblem(field=field, problem="required (may be empty)")
    if not isinstance(value, list | tuple):
        raise DeclarationProblem(
            field=field, problem="must be a list (use [] when the turn writes nothing)"
        )
    out: list[DeclaredOutput] = []
    seen: set[str] = set()
    for i, entry in enumerate(value):
        where = f"{field}[{i}]"
        path: object
        role: object
        if isinstance(entry, DeclaredOutput):
            path, role = entry.path, entry.role
        elif isinstance(entry, str):
            path, role = entry, DEFAULT_ROLE
        elif isinstance(entry, Mapping):
            path, role = entry.get("path"), entry.get("role")
            if role is None:
                role = DEFAULT_ROLE
        else:
            raise DeclarationProblem(
                field=where, problem="must be a path or an object with path and role"
            )
        problem = _path_problem(path)
        if problem is not None:
            raise DeclarationProblem(field=f"{where}.path", problem=problem)
        assert isinstance(path, str)
        problem = _role_problem(role)
        if problem is not None:
            raise DeclarationProblem(field=f"{where}.role", problem=problem)
        assert isinstance(role, str)
        if path in seen:
            raise DeclarationProblem(field=f"{where}.path", problem=f"{path!r} declared twice")
        seen.add(path)
        out.append(DeclaredOutput(path, role))
    return tuple(out)
