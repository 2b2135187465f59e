"""`supervisor.config` is the package's interface: every name it lists is importable from it."""

from __future__ import annotations

import importlib

import supervisor.config
from supervisor.errors import ConfigError


def test_every_public_name_is_reexported() -> None:
    """Names callers import from `supervisor.config` are the defining modules' objects."""
    for name in supervisor.config.__all__:
        assert hasattr(supervisor.config, name), name
    assert supervisor.config.ConfigError is ConfigError
    for module, name in (
        ("supervisor.config.schema", "Config"),
        ("supervisor.config.loader", "load_config"),
        ("supervisor.config.diff", "diff_reloadable"),
        ("supervisor.config.show", "add_parser"),
    ):
        assert getattr(supervisor.config, name) is getattr(importlib.import_module(module), name)
