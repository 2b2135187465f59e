"""What a SIGHUP reload applies and what needs a restart."""

from __future__ import annotations

from pathlib import Path

from supervisor.config.diff import changed_keys, diff_reloadable
from supervisor.config.loader import load_config


def test_diff_reloadable_splits_changes(tmp_path: Path) -> None:
    """Log level, retry and heartbeat changes reload; socket paths need a restart."""
    old = load_config(None, env={"HUNTER_ROOT": str(tmp_path)})
    new = load_config(
        None,
        env={
            "HUNTER_ROOT": str(tmp_path),
            "HUNTER_LOG__LEVEL": "debug",
            "HUNTER_RETRY__MAX_ATTEMPTS": "4",
            "HUNTER_EXECUTORS__HEARTBEAT_INTERVAL_S": "1",
            "HUNTER_CONTROL_SOCKET": str(tmp_path / "c.sock"),
            "HUNTER_EXECUTORS__QUEUE_CAPACITY": "5",
        },
    )
    diff = diff_reloadable(old, new)
    assert diff.reloadable == (
        "executors.heartbeat_interval_s",
        "retry.max_attempts",
        "log.level",
    )
    assert diff.restart_required == ("control_socket", "executors.queue_capacity")
    assert diff.changed == tuple(sorted(diff.reloadable + diff.restart_required))
    assert changed_keys(old, old) == ()
    assert diff_reloadable(old, old).changed == ()
