"""`McpSettings`: what one `hunter mcp` serves and the limits of each MCP session.

Read from the ``[mcp]`` table of a TOML file (``--settings FILE``), then the flags. Every key is
optional; an unknown key or a value out of range is a `ConfigError` naming it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Final

from supervisor.errors import ConfigError

__all__ = ["DEFAULT_SERVER_NAME", "McpSettings", "load_settings"]

DEFAULT_SERVER_NAME: Final = "hunter-mcp"


@dataclass(frozen=True, slots=True, kw_only=True)
class McpSettings:
    """One MCP server's settings; *socket* is the daemon's control socket."""

    socket: Path
    #: the server's name in the MCP handshake and in every turn's ``requested_by``
    server_name: str = DEFAULT_SERVER_NAME
    #: packages an agent may open sessions on (None: every package installed on the root)
    allowed_packages: frozenset[str] | None = None
    #: turns one MCP session may have running at once; one more is refused (nothing runs)
    max_turns_in_flight: int = 4
    #: all the turns in flight through this server (one control connection carries them)
    max_turns_in_flight_total: int = 128
    #: stdout, stderr and file bytes one tool call returns, at most
    max_output_bytes: int = 65_536
    #: ... and all the calls of one MCP session together (then only the truncation is said)
    max_session_output_bytes: int = 16 * 1024 * 1024
    #: how long a tool call may wait for its turn to settle (the agent may ask for less)
    max_wait_s: float = 600.0
    #: ... when the agent does not say
    default_wait_s: float = 120.0
    #: files `list_outputs` names at most
    max_listed_files: int = 1_000
    #: argv elements, and the bytes of all of them together
    max_argv: int = 256
    max_argv_bytes: int = 131_072

    def __post_init__(self) -> None:
        for name in (
            "max_turns_in_flight",
            "max_turns_in_flight_total",
            "max_output_bytes",
            "max_session_output_bytes",
            "max_listed_files",
            "max_argv",
            "max_argv_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"mcp.{name}", "must be a whole number of at least 1")
        for name in ("max_wait_s", "default_wait_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"mcp.{name}", "must be a number of seconds, 0 or more")
        if self.default_wait_s > self.max_wait_s:
            raise ConfigError("mcp.default_wait_s", "must not be over max_wait_s")
        if not 1 <= len(self.server_name) <= 256:
            raise ConfigError("mcp.server_name", "must be 1 to 256 characters")

    def allows(self, package_id: str) -> bool:
        return self.allowed_packages is None or package_id in self.allowed_packages


_KEYS: Final = frozenset(f.name for f in fields(McpSettings)) - {"socket"}


def load_settings(socket: Path, *, path: Path | None = None, **overrides: object) -> McpSettings:
    """The settings for *socket*: the ``[mcp]`` table of *path* (if given), then *overrides*
    (the flags; None values are left out)."""
    table: dict[str, object] = {}
    if path is not None:
        try:
            loaded = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError("(file)", f"cannot be read: {exc}", source=str(path)) from None
        raw = loaded.get("mcp", {})
        if not isinstance(raw, dict):
            raise ConfigError("mcp", "must be a table", source=str(path))
        table.update(raw)
    table.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(
            f"mcp.{unknown[0]}", f"unknown key; the keys are {', '.join(sorted(_KEYS))}"
        )
    packages = table.pop("allowed_packages", None)
    settings = McpSettings(socket=socket)
    if packages is not None:
        if not isinstance(packages, list | tuple | frozenset) or not all(
            isinstance(p, str) and p for p in packages
        ):
            raise ConfigError("mcp.allowed_packages", "must be a list of package ids")
        settings = replace(settings, allowed_packages=frozenset(packages))
    try:
        return replace(settings, **table)  # type: ignore[arg-type]  # checked in __post_init__
    except TypeError as exc:
        raise ConfigError("mcp", str(exc)) from None
