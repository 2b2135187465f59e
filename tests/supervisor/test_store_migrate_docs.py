"""What docs/operations.md shows `hunter store migrate` printing is what it prints (issue 21:
the doc said ``to version 1`` where the command printed 3).

The real command runs twice on a fresh database of the private PostgreSQL cluster, with the
doc's own configuration shape; each line the doc shows must be the real line, the server's
description and the schema version (the doc writes N, which it explains) aside. The server's
description of the doc's DSN is checked too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from supervisor.config.dsn import describe
from supervisor.store.postgres.schema import SCHEMA_VERSION

_DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _migrate(root: Path, config: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUNTER_")}
    argv = [sys.executable, "-m", "supervisor", "store", "migrate"]
    done = subprocess.run(
        [*argv, "--root", str(root), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_migrate_prints_what_the_doc_shows(pg_dsn: str, tmp_path: Path) -> None:
    """A first run migrates from no schema, a second says the schema is current: both lines
    as the PostgreSQL section shows them, with N the schema version of this release."""
    section = _section(_DOC.read_text(encoding="utf-8"), "PostgreSQL")
    dsn = re.search(r'^dsn = "([^"]+)"', section, re.M)
    assert dsn is not None, "the section shows no [store] dsn"
    first_doc = re.search(r"^# (postgresql server .*)$", section, re.M)
    again_doc = re.search(r'^# \(a second run: "\.\.\. (.*)"\)$', section, re.M)
    assert first_doc is not None, "the section shows no output of a first run"
    assert again_doc is not None, "the section shows no output of a second run"
    where_doc, _, said_doc = first_doc.group(1).partition(": ")
    assert where_doc == describe(dsn.group(1))

    config = tmp_path / "hunter.toml"
    config.write_text(f'[store]\nengine = "postgres"\ndsn = "{pg_dsn}"\n', encoding="utf-8")
    where = describe(pg_dsn)
    version = str(SCHEMA_VERSION)
    first = _migrate(tmp_path / "root", config)
    again = _migrate(tmp_path / "root", config)
    assert first == f"{where}: {said_doc.replace('version N', f'version {version}')}"
    assert again == f"{where}: {again_doc.group(1).replace('version N', f'version {version}')}"
    # the doc names no version of its own that would drift
    assert not re.search(r"version \d", first_doc.group(0) + again_doc.group(0))
