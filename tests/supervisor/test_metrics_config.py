"""The `[metrics]` keys: loopback TCP or a Unix socket, textfile paths, env overrides, errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.config import ConfigError, load_config
from supervisor.metrics import TcpAddress, parse_listen


def test_metrics_are_off_by_default() -> None:
    """Without a [metrics] section nothing is served or written."""
    config = load_config(None, env={})
    assert config.metrics.listen == ""
    assert config.metrics.textfile is None


def test_env_overrides_listen_and_textfile(tmp_path: Path) -> None:
    """HUNTER_METRICS__LISTEN and HUNTER_METRICS__TEXTFILE work as for every key."""
    config = load_config(
        None,
        env={
            "HUNTER_METRICS__LISTEN": "127.0.0.1:9464",
            "HUNTER_METRICS__TEXTFILE": str(tmp_path / "hunter.prom"),
            "HUNTER_METRICS__TEXTFILE_INTERVAL_S": "2.5",
        },
    )
    assert config.metrics.listen == "127.0.0.1:9464"
    assert parse_listen(config.metrics.listen) == TcpAddress("127.0.0.1", 9464)
    assert config.metrics.textfile == tmp_path / "hunter.prom"
    assert config.metrics.textfile_interval_s == 2.5


def test_toml_section(tmp_path: Path) -> None:
    """The keys load from a [metrics] table; IPv6 loopback is written in brackets."""
    path = tmp_path / "hunter.toml"
    path.write_text('[metrics]\nlisten = "[::1]:9464"\nstatus_interval_s = 1\n', "utf-8")
    config = load_config(path, env={})
    assert parse_listen(config.metrics.listen) == TcpAddress("::1", 9464)
    assert config.metrics.status_interval_s == 1.0


def test_unix_socket_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A value with a '/' is a Unix socket path, relative to the current directory."""
    monkeypatch.chdir(tmp_path)
    config = load_config(None, env={"HUNTER_METRICS__LISTEN": "run/metrics.sock"})
    assert config.metrics.listen == str(tmp_path / "run" / "metrics.sock")
    assert parse_listen(config.metrics.listen) == tmp_path / "run" / "metrics.sock"


@pytest.mark.parametrize("address", ["0.0.0.0:9464", "192.0.2.7:9464", "example.net:9464"])
def test_non_loopback_address_is_refused(address: str) -> None:
    """Metrics have no authentication: only loopback addresses (or a socket) are accepted."""
    with pytest.raises(
        ConfigError, match=r"^config key 'metrics\.listen'.*is not a loopback address"
    ):
        load_config(None, env={"HUNTER_METRICS__LISTEN": address})


@pytest.mark.parametrize("value", ["9464", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000"])
def test_malformed_listen_is_refused(value: str) -> None:
    """A value that is neither HOST:PORT nor a path names the key and what is expected."""
    with pytest.raises(ConfigError, match=r"^config key 'metrics\.listen'.*HOST:PORT"):
        load_config(None, env={}, overrides={"metrics.listen": value})


def test_socket_path_too_long_is_refused(tmp_path: Path) -> None:
    """A Unix socket path longer than sun_path allows is refused at load time."""
    long = tmp_path / ("x" * 120) / "metrics.sock"
    with pytest.raises(ConfigError, match=r"^config key 'metrics\.listen'.*longer than 107 bytes"):
        load_config(None, env={}, overrides={"metrics.listen": os.fspath(long)})
