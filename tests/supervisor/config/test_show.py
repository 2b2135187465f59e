"""`hunter config show|check` and the TOML rendering."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from supervisor.config.loader import load_config
from supervisor.config.show import add_parser, to_toml


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hunter.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_to_toml_round_trips(tmp_path: Path) -> None:
    """The TOML rendering loads back to an equal Config."""
    config = load_config(
        None, env={"HUNTER_ALLOWED_UIDS": "0,5", "HUNTER_ROOT": str(tmp_path / 'a "b"')}
    )
    path = _write(tmp_path, to_toml(config))
    assert load_config(path, env={}) == config


def _config_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(argv)
    handler = args.handler
    assert callable(handler)
    return int(handler(args))


def test_config_show_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`hunter config show` prints TOML or JSON; `check` exits 2 naming the bad key."""
    assert _config_cli(["config", "show", "--root", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["root"] == str(tmp_path)
    assert _config_cli(["config", "show", "--root", str(tmp_path)]) == 0
    assert f'root = "{tmp_path}"' in capsys.readouterr().out
    bad = _write(tmp_path, "[retry]\nmax_attempts = 0\n")
    assert _config_cli(["config", "check", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hunter config: config key 'retry.max_attempts': must be >= 1, got 0")
    # the bad file is the root's hunter.toml: read when no other file is named
    assert _config_cli(["config", "check", "--root", str(tmp_path)]) == 2
    assert "retry.max_attempts" in capsys.readouterr().err
    assert _config_cli(["config", "check", "--root", str(tmp_path / "other")]) == 0
    assert capsys.readouterr().out == "configuration OK\n"
