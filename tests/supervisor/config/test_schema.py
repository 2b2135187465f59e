"""The configuration's key table: frozen settings, plain dicts, env names, documented keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from supervisor.config.loader import load_config
from supervisor.config.schema import RELOADABLE_KEYS, Config, env_var_name, iter_keys

_DOCS = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_to_dict_round_trips(tmp_path: Path) -> None:
    """to_dict() is plain data and loads back to an equal Config."""
    config = load_config(
        None,
        env={"HUNTER_ALLOWED_UIDS": "7,3", "HUNTER_ROOT": str(tmp_path)},
        overrides={"socket_mode": 0o640, "retry.jitter": 0.5},
    )
    data = config.to_dict()
    assert data["socket_mode"] == "0640"
    assert data["allowed_uids"] == [3, 7]
    assert data["root"] == str(tmp_path)
    assert load_config(None, env={}, overrides=data) == config
    assert "allowed_uids" not in load_config(None, env={}).to_dict()


def test_config_is_frozen() -> None:
    """Config and its sections cannot be mutated."""
    config = load_config(None, env={})
    with pytest.raises(AttributeError):
        config.drain_grace_s = 1.0  # type: ignore[misc]  # checking the runtime guard
    with pytest.raises(AttributeError):
        config.log.level = "debug"  # type: ignore[misc]  # checking the runtime guard


def test_reloadable_keys_are_known() -> None:
    """RELOADABLE_KEYS only names real keys; paths and socket settings are not among them."""
    keys = {k for k, _ in iter_keys()}
    assert keys >= RELOADABLE_KEYS
    assert {"root", "control_socket", "executor_socket", "socket_mode"}.isdisjoint(RELOADABLE_KEYS)


def test_env_var_names() -> None:
    """Sections are joined to keys with two underscores."""
    assert env_var_name("root") == "HUNTER_ROOT"
    assert (
        env_var_name("executors.heartbeat_interval_s") == "HUNTER_EXECUTORS__HEARTBEAT_INTERVAL_S"
    )


def test_every_key_has_a_docstring_and_a_docs_row() -> None:
    """Each key has a meaning in code and a row (key, env var) in docs/configuration.md."""
    text = _DOCS.read_text(encoding="utf-8")
    for key, spec in iter_keys():
        assert spec.doc, key
        row = re.search(rf"^\| `{re.escape(key)}` \|.*`{env_var_name(key)}`", text, re.M)
        assert row, f"docs/configuration.md has no row for {key}"


def test_config_type_has_no_extra_fields() -> None:
    """Config's top-level fields are the documented keys and the four sections."""
    names = set(Config.__struct_fields__)
    assert names == {k.partition(".")[0] for k, _ in iter_keys()}
