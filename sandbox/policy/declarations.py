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

Scratch (FR-RT-015/016). After a turn both sandbox areas are walked (``output/<sid>`` and
``tmp/<sid>``, which is also the turn's ``TMPDIR`` and ``HOME``) and every file found must be
declared; anything else is an undeclared write and blocks the turn (fail closed). A declaration
with role ``"scratch"`` allows files the turn may leave behind without promoting them: its path
is a *pattern*, and a pattern whose first segment is ``tmp`` addresses the ``tmp/<sid>`` area
(``tmp/**`` allows everything there), any other pattern the ``output/<sid>`` area
(``build/*.o``). Pattern grammar, per ``/``-separated segment: ``*`` any run of characters
but ``/``, ``?`` one such character, and a segment that is exactly ``**`` zero or more whole
segments. Scratch files are recorded in the evidence ledger, never promoted, and never
required to exist. Only scratch paths may hold ``*`` or ``?``: an output path is a literal
file name. A file of the ``tmp`` area is named ``tmp/<path>`` in violations too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_ROLE",
    "SCRATCH_ROLE",
    "TMP_AREA",
    "DeclarationProblem",
    "DeclaredOutput",
    "SurfaceComparison",
    "compare_surface",
    "parse_declared_outputs",
    "surface_target",
]

#: The role of an output declared without one.
DEFAULT_ROLE: Final = "output"
#: The role of files a turn may leave in its sandbox without promoting them (a pattern).
SCRATCH_ROLE: Final = "scratch"
#: The first segment of a scratch pattern (and of a violation's target) in ``tmp/<sid>``.
TMP_AREA: Final = "tmp"
_WILDCARDS: Final = frozenset("*?")
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

    @property
    def is_scratch(self) -> bool:
        """Whether this is a scratch pattern (allowed, recorded, never promoted)."""
        return self.role == SCRATCH_ROLE

    @property
    def area(self) -> str:
        """The sandbox area the declaration addresses: ``output``, or ``tmp`` for a scratch
        pattern whose first segment is ``tmp``."""
        if self.is_scratch and self.path.split("/", 1)[0] == TMP_AREA:
            return TMP_AREA
        return "output"

    @property
    def area_path(self) -> str:
        """The path (or pattern) relative to its area (``tmp/**`` -> ``**``)."""
        if self.area == TMP_AREA:
            return self.path.partition("/")[2] or "**"
        return self.path


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
        if role != SCRATCH_ROLE and _WILDCARDS & set(path):
            raise DeclarationProblem(
                field=f"{where}.path",
                problem=f"wildcards ('*', '?') are only allowed with role {SCRATCH_ROLE!r}",
            )
        if path in seen:
            raise DeclarationProblem(field=f"{where}.path", problem=f"{path!r} declared twice")
        seen.add(path)
        out.append(DeclaredOutput(path, role))
    return tuple(out)


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A scratch pattern (see the module docstring) as a regex over area-relative paths."""
    segments = pattern.split("/")
    if segments == ["**"]:
        return re.compile(".+")
    parts: list[str] = []
    for i, segment in enumerate(segments):
        if segment == "**":
            # zero or more whole segments, each with its separator
            parts.append("(?:[^/]+/)*" if i == 0 else "(?:/[^/]+)*")
            continue
        sep = "" if i == 0 or (i == 1 and segments[0] == "**") else "/"
        body = "".join(
            "[^/]*" if ch == "*" else "[^/]" if ch == "?" else re.escape(ch) for ch in segment
        )
        parts.append(sep + body)
    return re.compile("".join(parts))


@dataclass(frozen=True, slots=True)
class SurfaceComparison:
    """The files found in the sandbox after a turn, held against its declarations.

    Each file is ``(area, path)`` with *path* relative to its area. ``undeclared`` and
    ``missing`` block the turn; ``scratch`` pairs a file with the scratch pattern allowing it.
    """

    outputs: tuple[str, ...]
    scratch: tuple[tuple[str, str, str], ...]
    undeclared: tuple[tuple[str, str], ...]
    missing: tuple[str, ...]

    @property
    def matches(self) -> bool:
        """No undeclared file and no missing output."""
        return not self.undeclared and not self.missing


def surface_target(area: str, path: str) -> str:
    """How a sandbox file is named in violations: ``path`` in output, ``tmp/path`` in tmp."""
    return path if area == "output" else f"{area}/{path}"


def compare_surface(
    declared: Sequence[DeclaredOutput], found: Iterable[tuple[str, str]]
) -> SurfaceComparison:
    """Hold the files *found* (``(area, path)`` pairs) against *declared* (FR-RT-015/016).

    A file of the output area equal to a declared output's path is that output; a file
    matching a scratch pattern of its area is scratch; anything else is undeclared. A declared
    output no file matches is missing (the caller decides whether that counts: a failed
    command has not written its outputs).
    """
    exact = {d.path for d in declared if not d.is_scratch}
    patterns = [(d.area, d.path, _pattern_regex(d.area_path)) for d in declared if d.is_scratch]
    outputs: list[str] = []
    scratch: list[tuple[str, str, str]] = []
    undeclared: list[tuple[str, str]] = []
    for area, path in sorted(found):
        if area == "output" and path in exact:
            outputs.append(path)
            continue
        allowed = next((src for a, src, rx in patterns if a == area and rx.fullmatch(path)), None)
        if allowed is not None:
            scratch.append((area, path, allowed))
        else:
            undeclared.append((area, path))
    missing = tuple(sorted(exact - set(outputs)))
    return SurfaceComparison(tuple(outputs), tuple(scratch), tuple(undeclared), missing)
