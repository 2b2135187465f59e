"""What changed between two configurations, split by whether a SIGHUP reload can apply it."""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.config.schema import KEYS, RELOADABLE_KEYS, Config, value_of

__all__ = ["ConfigDiff", "changed_keys", "diff_reloadable"]


@dataclass(frozen=True, slots=True)
class ConfigDiff:
    """What changed between two configs, split by whether a SIGHUP reload can apply it."""

    reloadable: tuple[str, ...]
    restart_required: tuple[str, ...]

    @property
    def changed(self) -> tuple[str, ...]:
        """Every changed dotted key, sorted."""
        return tuple(sorted(self.reloadable + self.restart_required))


def changed_keys(old: Config, new: Config) -> tuple[str, ...]:
    """Dotted keys whose values differ, in documentation order."""
    return tuple(k for k in KEYS if value_of(old, k) != value_of(new, k))


def diff_reloadable(old: Config, new: Config) -> ConfigDiff:
    """Split the changed keys into those a reload applies and those that need a restart.

    The daemon applies `reloadable` keys on SIGHUP and logs `restart_required` ones
    (`config_reload_partial`), keeping their old values until the next start.
    """
    changed = changed_keys(old, new)
    return ConfigDiff(
        reloadable=tuple(k for k in changed if k in RELOADABLE_KEYS),
        restart_required=tuple(k for k in changed if k not in RELOADABLE_KEYS),
    )
