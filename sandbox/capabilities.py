"""Capability matching: read / write / execute / forbidden glob patterns (FR-RT-002/003/010).

Everything is matched on absolute, normalised paths with symlinks resolved:

* A pattern starting with ``/`` is absolute; any other pattern is relative to the session's
  workspace (the directory declared outputs are promoted into). The literal leading part of a
  pattern (the segments before the first wildcard) is itself resolved with ``realpath``, so
  ``/usr/bin/python3`` also matches the file the symlink points to.
* A path is matched after ``realpath`` (symlinks and ``..`` resolved). For ``forbidden`` both
  the normalised path and the resolved path are checked: either matching denies.
* ``forbidden`` always wins over ``read``/``write``/``execute``.

Glob grammar (per ``/``-separated segment): ``*`` any run of characters except ``/``;
``?`` one character except ``/``; ``[abc]``/``[!abc]`` a character class; a segment that is
exactly ``**`` matches zero or more whole segments (so ``/data/**`` matches ``/data`` itself
and everything beneath it, and ``**/*.key`` matches a ``.key`` file at any depth). ``**``
inside a longer segment (``a**b``) behaves like ``*``. Matching is case-sensitive.

Execute patterns may also be bare command names (``python3``): the name is looked up on the
turn's ``PATH`` when the capabilities are compiled and stands for that resolved file.

Execute entries are *commands* (FR-RT-002/003): ``"<program> [<argument pattern> ...]"``, split
like a shell line (``shlex``: quote an argument that holds spaces). The program is the path or
bare-name pattern above. An entry with no argument patterns allows the program with any
arguments; with argument patterns, the turn's arguments (``argv[1:]``) must match them one by
one, and all of them: a token that is exactly ``**`` matches zero or more whole arguments, and
in any other token ``*`` matches any run of characters (``/`` included) and ``?`` one
character; everything else is literal (so ``python3 scripts/trace.py --explain`` allows exactly
that argv, ``python3 scripts/trace.py --level=* **`` any level and any options after it).
Arguments are matched as text: ``./scripts/trace.py`` is not ``scripts/trace.py``. They
constrain the command a turn is started with; what that command runs in turn is governed by
the programs alone (the kernel's execute rules see no arguments).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "DEFAULT_TURN_PATH",
    "CapabilityCheck",
    "CompiledCapabilities",
    "ExecuteRule",
    "Pattern",
    "compile_capabilities",
    "compile_pattern",
    "literal_prefix",
    "normalise",
    "parse_execute_entry",
    "resolve",
    "resolve_command",
]

#: PATH given to turns and used to resolve bare command names.
DEFAULT_TURN_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
_GLOB_CHARS: Final = frozenset("*?[")


def normalise(path: str | os.PathLike[str], *, base: Path | None = None) -> str:
    """Absolute, ``..``-free path (lexically; symlinks untouched). NUL bytes are rejected."""
    text = os.fspath(path)
    if "\0" in text:
        raise ValueError("path contains a NUL byte")
    if not os.path.isabs(text):
        text = os.path.join(os.fspath(base) if base is not None else os.getcwd(), text)
    return os.path.normpath(text).replace("//", "/")


def resolve(path: str | os.PathLike[str], *, base: Path | None = None) -> str:
    """Absolute path with every symlink and ``..`` resolved (missing tails kept as given)."""
    return os.path.realpath(normalise(path, base=base))


def _segment_regex(segment: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "*":
            while i + 1 < len(segment) and segment[i + 1] == "*":
                i += 1
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = segment.find("]", i + 2 if segment[i + 1 : i + 2] in ("!", "^") else i + 1)
            if end == -1:
                out.append(re.escape(ch))
            else:
                body = segment[i + 1 : end]
                negate = body[:1] in ("!", "^")
                if negate:
                    body = body[1:]
                body = body.replace("\\", "\\\\")
                out.append(f"[{'^' if negate else ''}{body}]")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def literal_prefix(pattern: str) -> str:
    """The leading segments of an absolute pattern that contain no wildcard (``/`` at least)."""
    parts = pattern.split("/")
    keep: list[str] = []
    for part in parts:
        if _GLOB_CHARS & set(part):
            break
        keep.append(part)
    prefix = "/".join(keep)
    return prefix or "/"


def has_glob(pattern: str) -> bool:
    """Whether the pattern contains a wildcard character."""
    return bool(_GLOB_CHARS & set(pattern))


@dataclass(frozen=True, slots=True)
class Pattern:
    """One compiled pattern: the source text, its absolute form, its regex."""

    source: str
    absolute: str
    regex: re.Pattern[str]

    def matches(self, path: str) -> bool:
        """Whether the absolute, normalised *path* matches."""
        return self.regex.fullmatch("" if path == "/" else path) is not None

    @property
    def prefix(self) -> str:
        """The literal (wildcard-free) leading directory or file of the pattern."""
        return literal_prefix(self.absolute)


def compile_pattern(source: str, *, base: Path) -> Pattern:
    """Compile *source* (absolute, or relative to *base*) into a ``Pattern``."""
    text = source if source.startswith("/") else f"{os.fspath(base).rstrip('/')}/{source}"
    segments = [s for s in text.split("/") if s not in ("", ".")]
    # Resolve the literal prefix (symlinks, ..) so patterns and paths meet on real paths.
    literal: list[str] = []
    for seg in segments:
        if _GLOB_CHARS & set(seg):
            break
        literal.append(seg)
    rest = segments[len(literal) :]
    resolved_prefix = os.path.realpath("/" + "/".join(literal))
    absolute = resolved_prefix.rstrip("/") + ("/" + "/".join(rest) if rest else "")
    absolute = absolute or "/"
    regex_parts: list[str] = []
    for seg in [s for s in absolute.split("/") if s]:
        if seg == "**":
            regex_parts.append("(?:/[^/]+)*")
        else:
            regex_parts.append("/" + _segment_regex(seg))
    return Pattern(source=source, absolute=absolute, regex=re.compile("".join(regex_parts)))


_ANY_ARGS: Final = "**"


def parse_execute_entry(entry: str) -> tuple[str, tuple[str, ...] | None]:
    """Split an execute entry into its program pattern and argument patterns (None: any).

    Raises ``ValueError`` with the problem for an entry that is not a command pattern.
    """
    try:
        tokens = shlex.split(entry, comments=False, posix=True)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        msg = f"not a command pattern: {str(exc).lower()}"
        raise ValueError(msg) from None
    if not tokens or not tokens[0]:
        msg = "not a command pattern: no program"
        raise ValueError(msg)
    if tokens[0] == _ANY_ARGS:
        msg = "not a command pattern: '**' cannot be the program"
        raise ValueError(msg)
    if len(tokens) == 1:
        return tokens[0], None
    return tokens[0], tuple(tokens[1:])


def _argument_regex(patterns: Sequence[str]) -> re.Pattern[str]:
    """One regex over the arguments, each preceded by a NUL (which no argument holds)."""
    parts: list[str] = []
    for token in patterns:
        if token == _ANY_ARGS:
            parts.append("(?:\0[^\0]*)*")
            continue
        body = "".join(
            "[^\0]*" if ch == "*" else "[^\0]" if ch == "?" else re.escape(ch) for ch in token
        )
        parts.append("\0" + body)
    return re.compile("".join(parts))


@dataclass(frozen=True, slots=True)
class ExecuteRule:
    """One ``capabilities.execute`` entry: its program pattern and argument patterns."""

    source: str
    program: Pattern
    #: the argument patterns as written (None: any arguments)
    args: tuple[str, ...] | None = None
    args_regex: re.Pattern[str] | None = None

    def allows_args(self, args: Sequence[str]) -> bool:
        """Whether *args* (``argv[1:]``) match this rule's argument patterns."""
        if self.args_regex is None:
            return True
        if any("\0" in a for a in args):
            return False
        joined = "".join(f"\0{a}" for a in args)
        return self.args_regex.fullmatch(joined) is not None


@dataclass(frozen=True, slots=True)
class CapabilityCheck:
    """The answer to "may this operation touch this path?"."""

    allowed: bool
    capability: str
    path: str
    matched: str = ""
    #: why a program that is allowed was refused: its arguments match none of its entries
    reason: str = ""


def resolve_command(argv0: str, *, cwd: Path, search_path: str = DEFAULT_TURN_PATH) -> str | None:
    """Resolve a command to the absolute, symlink-free executable it would run, or None."""
    if "\0" in argv0 or not argv0:
        return None
    if "/" in argv0:
        candidate = resolve(argv0, base=cwd)
    else:
        found = shutil.which(argv0, path=search_path)
        if found is None:
            return None
        candidate = os.path.realpath(found)
    if not os.path.isfile(candidate) or not os.access(candidate, os.X_OK):
        return None
    return candidate


@dataclass(frozen=True, slots=True)
class CompiledCapabilities:
    """Capabilities of one session, compiled against its workspace."""

    read: tuple[Pattern, ...]
    write: tuple[Pattern, ...]
    #: the program patterns of the execute entries (their literal prefixes are execute roots)
    execute: tuple[Pattern, ...]
    forbidden: tuple[Pattern, ...]
    workspace: Path
    #: the execute entries with their argument patterns
    execute_rules: tuple[ExecuteRule, ...] = ()

    def forbidden_match(self, path: str | os.PathLike[str]) -> Pattern | None:
        """The forbidden pattern matching the normalised or resolved *path*, if any."""
        plain = normalise(path, base=self.workspace)
        real = os.path.realpath(plain)
        for pat in self.forbidden:
            if pat.matches(plain) or pat.matches(real):
                return pat
        return None

    def _check(self, patterns: Sequence[Pattern], name: str, path: str) -> CapabilityCheck:
        real = resolve(path, base=self.workspace)
        bad = self.forbidden_match(path)
        if bad is not None:
            return CapabilityCheck(False, "capabilities.forbidden", real, bad.source)
        for pat in patterns:
            if pat.matches(real):
                return CapabilityCheck(True, name, real, pat.source)
        return CapabilityCheck(False, name, real)

    def check_read(self, path: str | os.PathLike[str]) -> CapabilityCheck:
        """May the turn read *path*?"""
        return self._check(self.read, "capabilities.read", os.fspath(path))

    def check_write(self, path: str | os.PathLike[str]) -> CapabilityCheck:
        """May the turn write *path* (relative paths are relative to the workspace)?"""
        return self._check(self.write, "capabilities.write", os.fspath(path))

    def check_execute(
        self, path: str | os.PathLike[str], *, args: Sequence[str] | None = None
    ) -> CapabilityCheck:
        """May the turn execute the (resolved) program at *path* with *args* (``argv[1:]``)?

        Without *args* only the program is checked (what the kernel enforces for the
        programs a turn's command runs in turn); with them, an entry allowing the program
        must also allow the arguments.
        """
        name = "capabilities.execute"
        check = self._check(self.execute, name, os.fspath(path))
        if not check.allowed or args is None:
            return check
        programs = [r for r in self.execute_rules if r.program.matches(check.path)]
        for rule in programs:
            if rule.allows_args(args):
                return CapabilityCheck(True, name, check.path, rule.source)
        allowed = "; ".join(repr(r.source) for r in programs)
        reason = f"arguments {list(args)!r} match no allowed command ({allowed})"
        return CapabilityCheck(False, name, check.path, reason=reason)

    def prefixes(self, kind: str) -> tuple[str, ...]:
        """Existing literal prefixes of the ``read``/``execute``/``write`` patterns."""
        pats = {"read": self.read, "execute": self.execute, "write": self.write}[kind]
        return tuple(dict.fromkeys(p.prefix for p in pats))


def compile_capabilities(
    *,
    read: Iterable[str],
    write: Iterable[str],
    execute: Iterable[str],
    forbidden: Iterable[str],
    workspace: Path,
    search_path: str = DEFAULT_TURN_PATH,
) -> CompiledCapabilities:
    """Compile manifest patterns for a session whose workspace is *workspace*."""
    ws = Path(os.path.realpath(workspace))
    rules: list[ExecuteRule] = []
    for src in execute:
        program, args = parse_execute_entry(src)
        if "/" not in program and not has_glob(program):
            found = shutil.which(program, path=search_path)
            if found is None:
                continue  # an unknown bare command allows nothing
            compiled = compile_pattern(os.path.realpath(found), base=ws)
            pattern = Pattern(source=src, absolute=compiled.absolute, regex=compiled.regex)
        else:
            compiled = compile_pattern(program, base=ws)
            pattern = Pattern(source=src, absolute=compiled.absolute, regex=compiled.regex)
        regex = None if args is None else _argument_regex(args)
        rules.append(ExecuteRule(src, pattern, args, regex))
    exe = [r.program for r in rules]
    return CompiledCapabilities(
        read=tuple(compile_pattern(p, base=ws) for p in read),
        write=tuple(compile_pattern(p, base=ws) for p in write),
        execute=tuple(exe),
        forbidden=tuple(compile_pattern(p, base=ws) for p in forbidden),
        workspace=ws,
        execute_rules=tuple(rules),
    )
