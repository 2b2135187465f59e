"""The SIGHUP reload's configuration: the running one with the reloadable keys of a new one
applied, and the keys that need a restart named (`reloaded`). Pure: the daemon applies the
result to its parts (logging, the turn core's settings, the hub's) and logs what changed."""

from __future__ import annotations

import msgspec

from supervisor.config import Config, ConfigDiff, diff_reloadable

__all__ = ["reloaded"]


def reloaded(current: Config, new: Config) -> tuple[Config, ConfigDiff]:
    """*current* with the reloadable keys of *new* that changed, and what changed."""
    diff = diff_reloadable(current, new)
    applied = current
    for key in diff.reloadable:
        section, _, name = key.rpartition(".")
        if section:
            holder = msgspec.structs.replace(
                getattr(applied, section), **{name: getattr(getattr(new, section), name)}
            )
            applied = msgspec.structs.replace(applied, **{section: holder})
        else:
            applied = msgspec.structs.replace(applied, **{name: getattr(new, name)})
    return applied, diff
