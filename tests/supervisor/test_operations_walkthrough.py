"""`docs/operations.md` walked as a new operator would: the commands it shows are run for real.

* Statically: every `jq` filter in the Logs section that selects an event names only fields
  `docs/logging.md` documents for that event (a filter on a field that is never logged selects
  everything or nothing, silently).
* Under a real systemd (a throwaway container, as in `test_systemd_units.py`): the units are
  installed as the doc says, metrics are turned on with the drop-in it shows, a process turn
  runs, the doc's `curl` scrape answers with a real Prometheus text (parsed with
  `prometheus_client.parser`), and each `journalctl -t hunter -o cat | jq ...` line of the doc
  runs as written and gives JSON (the doc once said `-u hunter`, which also brings systemd's
  plain-text lines about the unit, and `jq .` stopped at the first).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.supervisor.test_systemd_units import (
    _boot,
    _install,
    _nspawn_missing_reason,
    _write_share,
)

_REPO = Path(__file__).resolve().parents[2]
_OPERATIONS = _REPO / "docs" / "operations.md"
_LOGGING = _REPO / "docs" / "logging.md"


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _journal_commands() -> list[str]:
    logs = _section(_OPERATIONS.read_text(encoding="utf-8"), "Logs")
    return [
        line.strip()
        for line in logs.splitlines()
        if line.strip().startswith("journalctl -t hunter -o cat") and " -f " not in line
    ]


def _documented_fields() -> dict[str, set[str]]:
    fields: dict[str, set[str]] = {}
    for line in _LOGGING.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\| `([a-z_]+)` \| [a-z]+ \| (.*?) \|", line)
        if match:
            fields[match.group(1)] = set(re.findall(r"`([a-z_]+)`", match.group(2)))
    return fields


_COMMON = {"timestamp", "level", "logger", "event"}


def test_the_docs_jq_filters_use_logged_fields() -> None:
    commands = _journal_commands()
    assert commands, "docs/operations.md shows no journalctl | jq line"
    documented = _documented_fields()
    for command in commands:
        for event in re.findall(r'\.event == "([a-z_]+)"', command):
            assert event in documented, f"{command}: no event {event} in docs/logging.md"
            used = set(re.findall(r"\.([a-z_]+)\b", command)) - {"event"}
            unknown = used - documented[event] - _COMMON
            assert not unknown, f"{command}: {event} has no field(s) {sorted(unknown)}"


def _json_values(text: str) -> int:
    """How many JSON values *text* holds, one after another (jq's output); ValueError if not."""
    decoder = json.JSONDecoder()
    count, at = 0, 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return count
        _, at = decoder.raw_decode(text, at)
        count += 1


@pytest.mark.systemd
@pytest.mark.skipif(_nspawn_missing_reason() is not None, reason=str(_nspawn_missing_reason()))
def test_operations_guide_under_real_systemd(tmp_path: Path) -> None:
    share = tmp_path / "share"
    share.mkdir()
    _write_share(share)
    # docs/operations.md, Metrics: "or with HUNTER_METRICS__LISTEN in a drop-in"
    (share / "metrics.conf").write_text(
        "[Service]\nEnvironment=HUNTER_METRICS__LISTEN=/run/hunter/metrics.sock\n",
        encoding="utf-8",
    )
    with _boot(share, tmp_path / "nspawn.log") as c:
        _install(c)
        c.run(
            "install",
            "-D",
            "-m",
            "0644",
            "/mnt/share/metrics.conf",
            "/etc/systemd/system/hunter.service.d/metrics.conf",
        )
        c.run("systemctl", "daemon-reload")

        hunter = str(Path(sys.prefix) / "bin" / "hunter")
        control = ("--socket", "/run/hunter/control.sock")
        opened = c.run(hunter, "session", "open", "demo", *control, "--json")
        session_id = json.loads(opened.stdout)["session_id"]
        submit = (hunter, "submit", *control, "--session", session_id, "--wait", "--json")
        script = 'echo hello > "$HUNTER_OUTPUT_DIR/result.txt"'
        done = c.run(
            *submit, "--declare-output=result.txt:report", "--", "sh", "-c", script, timeout_s=60
        )
        assert json.loads(done.stdout)["state"] == "succeeded", done.stdout

        # the doc's scrape, the socket form
        scrape = c.run(
            "curl",
            "-s",
            "--unix-socket",
            "/run/hunter/metrics.sock",
            "http://localhost/metrics",
        ).stdout
        families = {f.name: f for f in text_string_to_metric_families(scrape)}
        durations = families["hunter_turn_duration_seconds"]
        counted = [
            s.value
            for s in durations.samples
            if s.name.endswith("_count") and s.labels.get("state") == "succeeded"
        ]
        assert counted, scrape[:2000]
        assert sum(counted) >= 1

        # the doc's journal lines, as written (without -f)
        for command in _journal_commands():
            ran = c.run("bash", "-c", f"set -o pipefail; {command}", check=False)
            assert ran.returncode == 0, (command, ran.stderr)
            assert _json_values(ran.stdout) >= (1 if "select" not in command else 0), command
        everything = c.run("sh", "-c", "journalctl -t hunter -o cat | jq -c .event").stdout
        assert '"turn_finished"' in everything
        c.run("systemctl", "stop", "hunter.service", timeout_s=60)
    assert c.nspawn.returncode == 0, (tmp_path / "nspawn.log").read_text()
