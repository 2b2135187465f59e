"""The demo's root directory: its short-timeout config, the `demo` package, `prepare_root`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Final

__all__ = ["DEMO_CONFIG", "DEMO_MANIFEST", "prepare_root"]


#: The demo daemon's config: everything short so that faults play out in seconds.
DEMO_CONFIG: Final = """\
# hunter demo: short timeouts and backoff so that every fault plays out in seconds
drain_grace_s = 2.0

[executors]
heartbeat_interval_s = 0.5
heartbeat_misses = 3
queue_wait_s = 3.0
quarantine_s = 60.0
cancel_grace_s = 0.5
hello_timeout_s = 2.0

[retry]
max_attempts = 3
base_delay_ms = 50
backoff_multiplier = 2.0
max_delay_ms = 200

[sandbox]
enforcement = "best-effort"
default_timeout_ms = 5000

[log]
format = "json"
level = "info"
"""

#: Fallback copy of examples/packages/demo/manifest.json (used when run from an install).
DEMO_MANIFEST: Final = """\
{
  "id": "demo",
  "version": "1.0",
  "description": "The package `hunter demo` opens its session with.",
  "capabilities": {
    "read": ["/usr/**", "/etc/**"],
    "write": ["**"],
    "execute": ["/usr/bin/*", "/bin/*", "/usr/local/bin/*"],
    "forbidden": ["/etc/shadow", "/etc/gshadow", "/root/**"],
    "network": false
  },
  "limits": {"memory_mb": 64, "pids": 32, "timeout_s": 60}
}
"""


def _source_manifest() -> str:
    here = Path(__file__).resolve().parent.parent / "examples" / "packages" / "demo"
    path = here / "manifest.json"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return DEMO_MANIFEST


def prepare_root(root: Path, *, fresh: bool, config_text: str = DEMO_CONFIG) -> Path:
    """Create *root* with the demo config and package; returns the config file's path."""
    if fresh and root.exists():
        shutil.rmtree(root)
    (root / "installed" / "demo").mkdir(parents=True, exist_ok=True)
    (root / "installed" / "demo" / "manifest.json").write_text(_source_manifest(), "utf-8")
    config = root / "hunter.toml"
    config.write_text(config_text, encoding="utf-8")
    return config
