"""docs/metrics.md lists every metric the daemon exports, with its type (as logging.md does for
log events): a real daemon is scraped and its exposition parsed with prometheus-client's parser."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import anyio
from prometheus_client.parser import text_string_to_metric_families

from supervisor.config import load_config
from supervisor.server import Daemon

_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
_ROW = re.compile(r"^\| `(hunter_[a-z0-9_]+)` \| (counter|gauge|histogram) \|", re.M)


def _documented() -> dict[str, str]:
    return dict(_ROW.findall(_DOC.read_text(encoding="utf-8")))


async def _scrape_unix(path: Path) -> str:
    async with await anyio.connect_unix(path) as stream:
        await stream.send(b"GET /metrics HTTP/1.0\r\n\r\n")
        data = b""
        with contextlib.suppress(anyio.EndOfStream):
            while True:
                data += await stream.receive()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK"), head
    return body.decode()


def _exported(text: str) -> dict[str, str]:
    """Exported names as documented: counters with `_total`, histograms by their base name."""
    names: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        names[name] = family.type
    return names


async def test_every_exported_metric_is_documented(tmp_path: Path) -> None:
    """Each metric a running daemon exports has a row with the right type in docs/metrics.md,
    and every row names a metric the daemon exports."""
    listen = tmp_path / "metrics.sock"
    config = load_config(
        None, env={}, overrides={"root": tmp_path / "r", "metrics.listen": str(listen)}
    )
    daemon = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        try:
            exported = _exported(await _scrape_unix(listen))
        finally:
            daemon.request_drain()
    documented = _documented()
    assert len(exported) >= 25  # the scan itself works
    undocumented = sorted(set(exported) - set(documented))
    assert not undocumented, f"metrics missing from docs/metrics.md: {undocumented}"
    stale = sorted(set(documented) - set(exported))
    assert not stale, f"docs/metrics.md lists metrics the daemon does not export: {stale}"
    wrong = {n: (t, documented[n]) for n, t in exported.items() if documented[n] != t}
    assert not wrong, f"exported type differs from the documented one: {wrong}"
    assert not listen.exists(), "the metrics socket is removed when the daemon stops"
