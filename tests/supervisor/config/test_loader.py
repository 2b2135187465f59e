"""Loading and validating the daemon configuration: sources, precedence, parse errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config.loader import RESERVED_ENV, load_config
from supervisor.config.schema import ExecutorSettings
from supervisor.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hunter.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_the_embedded_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing configured, everything lives under ./.hunter, made absolute."""
    monkeypatch.chdir(tmp_path)
    config = load_config(None, env={})
    root = tmp_path / ".hunter"
    assert config.root == root
    assert config.runtime_dir == root / "run"
    assert config.control_socket == root / "run" / "control.sock"
    assert config.executor_socket == root / "run" / "executors.sock"
    assert config.intake_path == root / "state" / "turns.sqlite3"
    assert config.socket_mode == 0o660
    assert config.allowed_uids is None
    assert config.executors == ExecutorSettings()
    assert config.retry.max_attempts == 3
    assert config.retry.base_delay_ms == 500
    assert config.log.format == "auto"


def test_systemd_directories_are_defaults(tmp_path: Path) -> None:
    """$STATE_DIRECTORY and $RUNTIME_DIRECTORY (first of several) set root and runtime_dir."""
    env = {
        "STATE_DIRECTORY": f"{tmp_path}/state:{tmp_path}/other",
        "RUNTIME_DIRECTORY": f"{tmp_path}/run",
    }
    config = load_config(None, env=env)
    assert config.root == tmp_path / "state"
    assert config.runtime_dir == tmp_path / "run"
    assert config.control_socket == tmp_path / "run" / "control.sock"
    assert config.intake_path == tmp_path / "state" / "state" / "turns.sqlite3"


def test_file_env_override_precedence(tmp_path: Path) -> None:
    """File beats systemd defaults, HUNTER_* beats the file, overrides beat everything."""
    path = _write(
        tmp_path,
        f"""
        root = "{tmp_path}/from-file"
        drain_grace_s = 5
        [executors]
        heartbeat_interval_s = 1.5
        quarantine_s = 10
        [log]
        level = "debug"
        """,
    )
    env = {
        "STATE_DIRECTORY": f"{tmp_path}/from-systemd",
        "HUNTER_EXECUTORS__QUARANTINE_S": "20",
        "HUNTER_LOG__LEVEL": "WARNING",
        "HUNTER_DRAIN_GRACE_S": "7.5",
    }
    config = load_config(path, env=env, overrides={"log.level": "error", "root": None})
    assert config.root == tmp_path / "from-file"
    assert config.executors.heartbeat_interval_s == 1.5
    assert config.executors.quarantine_s == 20.0
    assert config.drain_grace_s == 7.5
    assert config.log.level == "error"


def test_hunter_config_env_names_the_file(tmp_path: Path) -> None:
    """Without an explicit path, $HUNTER_CONFIG is read."""
    path = _write(tmp_path, "[retry]\nmax_attempts = 5\n")
    config = load_config(None, env={"HUNTER_CONFIG": str(path)})
    assert config.retry.max_attempts == 5


def test_env_values_are_parsed(tmp_path: Path) -> None:
    """Environment strings become ints, floats, octal modes and uid sets."""
    env = {
        "HUNTER_ROOT": str(tmp_path / "r"),
        "HUNTER_SOCKET_MODE": "0600",
        "HUNTER_ALLOWED_UIDS": "1000, 0,1000",
        "HUNTER_EXECUTORS__MAX_FRAME_BYTES": "2_000_000",
        "HUNTER_RETRY__JITTER": "0.25",
        "HUNTER_SANDBOX__ENFORCEMENT": "Strict",
        "HUNTER_LOG__FORMAT": "json",
    }
    config = load_config(None, env=env)
    assert config.root == tmp_path / "r"
    assert config.socket_mode == 0o600
    assert config.allowed_uids == frozenset({0, 1000})
    assert config.executors.max_frame_bytes == 2_000_000
    assert config.retry.jitter == 0.25
    assert config.sandbox.enforcement == "strict"
    assert config.log.format == "json"


def test_toml_socket_mode_forms(tmp_path: Path) -> None:
    """socket_mode accepts a TOML octal integer or an octal string."""
    assert load_config(_write(tmp_path, "socket_mode = 0o640\n"), env={}).socket_mode == 0o640
    assert load_config(_write(tmp_path, 'socket_mode = "0o600"\n'), env={}).socket_mode == 0o600


def test_relative_paths_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths are taken from the current directory."""
    monkeypatch.chdir(tmp_path)
    config = load_config(None, env={"HUNTER_RUNTIME_DIR": "sock"}, overrides={"root": "data"})
    assert config.root == tmp_path / "data"
    assert config.runtime_dir == tmp_path / "sock"
    assert config.control_socket == tmp_path / "sock" / "control.sock"


@pytest.mark.parametrize(
    ("toml", "pattern"),
    [
        (
            "rooot = 'x'\n",
            r"^config key 'rooot': unknown key; did you mean 'root'\? \(from .*hunter\.toml\)$",
        ),
        ("[executors]\nheartbeat = 1\n", r"^config key 'executors\.heartbeat': unknown key"),
        ("[nope]\nx = 1\n", r"^config key 'nope': unknown key"),
        ("executors = 3\n", r"^config key 'executors': must be a table"),
        (
            "[executors]\nheartbeat_interval_s = 'fast'\n",
            r"^config key 'executors\.heartbeat_interval_s': expected a number, got 'fast'",
        ),
        (
            "[executors]\nheartbeat_interval_s = 0\n",
            r"^config key 'executors\.heartbeat_interval_s': must be >= 0\.01, got 0\.0",
        ),
        ("[executors]\nqueue_wait_s = 0\n", r"^config key 'executors\.queue_wait_s': must be > 0"),
        (
            "[retry]\nmax_attempts = true\n",
            r"^config key 'retry\.max_attempts': expected an integer",
        ),
        (
            "[retry]\nmax_attempts = 2.5\n",
            r"^config key 'retry\.max_attempts': expected an integer",
        ),
        ("[retry]\njitter = 1.5\n", r"^config key 'retry\.jitter': must be <= 1, got 1\.5"),
        ("[retry]\njitter = nan\n", r"^config key 'retry\.jitter': expected a finite number"),
        (
            "[retry]\nbase_delay_ms = 1000\nmax_delay_ms = 10\n",
            r"^config key 'retry\.max_delay_ms': must be >= retry\.base_delay_ms \(1000\), got 10$",
        ),
        (
            "[sandbox]\nenforcement = 'loose'\n",
            r"^config key 'sandbox\.enforcement': must be one of 'strict', 'best-effort', "
            r"got 'loose'",
        ),
        (
            "[sandbox]\nuid_range_start = 4294967000\n",
            r"^config key 'sandbox\.uid_range_size': range starting at 4294967000",
        ),
        ("[log]\nlevel = 'loud'\n", r"^config key 'log\.level': must be one of"),
        ("socket_mode = 0o1777\n", r"^config key 'socket_mode': must be <= 0777, got 1777"),
        ("socket_mode = '66x'\n", r"^config key 'socket_mode': expected an octal mode"),
        ("allowed_uids = [1, -1]\n", r"^config key 'allowed_uids': expected uids between"),
        ("allowed_uids = 5\n", r"^config key 'allowed_uids': expected a list of uids"),
        ("root = ''\n", r"^config key 'root': expected a non-empty path string"),
        ("root = 5\n", r"^config key 'root': expected a non-empty path string"),
        (
            "control_socket = '/run/x.sock'\nexecutor_socket = '/run/x.sock'\n",
            r"^config key 'executor_socket': must differ from control_socket",
        ),
        (
            f"control_socket = '/{'x' * 120}.sock'\n",
            r"^config key 'control_socket': socket path is longer than 107 bytes",
        ),
    ],
)
def test_invalid_file_values(tmp_path: Path, toml: str, pattern: str) -> None:
    """Every invalid value names its dotted key and the problem."""
    with pytest.raises(ConfigError, match=pattern):
        load_config(_write(tmp_path, toml), env={})


def test_invalid_toml_reports_the_line(tmp_path: Path) -> None:
    """A TOML syntax error carries the line number."""
    path = _write(tmp_path, "[log]\nlevel = 'info'\nformat = = 'json'\n")
    with pytest.raises(
        ConfigError, match=r"^config key '\(file\)': invalid TOML in .*line 3"
    ) as info:
        load_config(path, env={})
    assert info.value.line == 3
    assert info.value.key == "(file)"


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    """A missing file and a binary file are ConfigErrors about the file."""
    with pytest.raises(ConfigError, match=r"^config key '\(file\)': cannot read .*missing\.toml"):
        load_config(tmp_path / "missing.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"root = '\xff'\n")
    with pytest.raises(ConfigError, match=r"^config key '\(file\)': .*is not UTF-8 text"):
        load_config(bad, env={})


@pytest.mark.parametrize(
    ("env", "pattern"),
    [
        (
            {"HUNTER_LOG_FORMAT": "json"},
            r"^config key 'log_format': unknown environment variable HUNTER_LOG_FORMAT .*"
            r"did you mean HUNTER_LOG__FORMAT\?",
        ),
        ({"HUNTER_EXECUTORS__NOPE": "1"}, r"^config key 'executors\.nope': unknown environment"),
        ({"HUNTER_LOG": "x"}, r"^config key 'log': unknown environment variable HUNTER_LOG "),
        (
            {"HUNTER_RETRY__MAX_ATTEMPTS": "three"},
            r"^config key 'retry\.max_attempts': expected an integer, got 'three' "
            r"\(from HUNTER_RETRY__MAX_ATTEMPTS\)$",
        ),
        ({"HUNTER_DRAIN_GRACE_S": "soon"}, r"^config key 'drain_grace_s': expected a number"),
        ({"HUNTER_ALLOWED_UIDS": "1,x"}, r"^config key 'allowed_uids': expected a comma-separated"),
    ],
)
def test_invalid_env(env: dict[str, str], pattern: str) -> None:
    """Unknown or malformed HUNTER_* variables are errors naming the key and the variable."""
    with pytest.raises(ConfigError, match=pattern):
        load_config(None, env=env)


def test_invalid_override() -> None:
    """Overrides are validated like any other source."""
    with pytest.raises(ConfigError, match=r"^config key 'log\.format': must be one of .*override"):
        load_config(None, env={}, overrides={"log": {"format": "xml"}})
    with pytest.raises(ConfigError, match=r"^config key 'bogus': unknown key \(from override\)$"):
        load_config(None, env={}, overrides={"bogus": 1})


def test_reserved_env_names_are_ignored() -> None:
    """HUNTER_* names owned by other parts of the product are not config keys, and not errors."""
    env = {name: "x" for name in RESERVED_ENV if name != "HUNTER_CONFIG"}
    assert load_config(None, env=env) == load_config(None, env={})
