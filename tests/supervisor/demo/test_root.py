"""The demo root: config file and the `demo` package, emptied first when asked."""

from __future__ import annotations

import json
from pathlib import Path

from supervisor.config import load_config
from supervisor.demo.root import DEMO_CONFIG, prepare_root


def test_prepare_root_writes_config_and_package(tmp_path: Path) -> None:
    """The config file is returned, valid, and the demo package is installed."""
    root = tmp_path / "r"
    config = prepare_root(root, fresh=True)
    assert config == root / "hunter.toml"
    assert config.read_text(encoding="utf-8") == DEMO_CONFIG
    manifest = json.loads((root / "installed" / "demo" / "manifest.json").read_text("utf-8"))
    assert manifest["id"] == "demo"
    loaded = load_config(config, env={}, overrides={"root": str(root)})
    assert loaded.retry.max_delay_ms == 200


def test_fresh_empties_the_root_first(tmp_path: Path) -> None:
    """With fresh=True an existing root is removed; without, its other files stay."""
    root = tmp_path / "r"
    prepare_root(root, fresh=True)
    (root / "leftover").write_text("x", encoding="utf-8")
    prepare_root(root, fresh=False, config_text="drain_grace_s = 1.0\n")
    assert (root / "leftover").exists()
    assert (root / "hunter.toml").read_text(encoding="utf-8") == "drain_grace_s = 1.0\n"
    prepare_root(root, fresh=True)
    assert not (root / "leftover").exists()
