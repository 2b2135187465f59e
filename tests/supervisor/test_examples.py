"""Tests of the example executors: the web executor against a loopback page server, the
document model it uses, and the chaos executor's configuration."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from sandbox.policy.attempts import OutcomeKind
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorInstructionEnvelope
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.safety import build_executor_instruction
from supervisor.examples import chaos_executor
from supervisor.examples.chaos_executor import ChaosPlan, parse_behaviour_spec
from supervisor.examples.html_model import (
    SelectorError,
    parse_html,
    render_pgm,
    select,
    visible_lines,
)
from supervisor.examples.page_server import DEMO_PAGES, PageServer
from supervisor.examples.web_executor import WebExecutor
from supervisor.executors.hub import AttemptReport, ExecutorHub, HubSettings, open_executor_listener
from supervisor.sdk import run_executor

# --------------------------------------------------------------------------- html model


def test_selectors_cover_tag_id_class_compound_and_descendant() -> None:
    """The CSS subset: tag, #id, .class, compounds and descendant combinators."""
    root = parse_html(DEMO_PAGES["/"])
    assert [e.id for e in select(root, "a")] == ["home", "catalogue-link"]
    assert [e.tag for e in select(root, "#title")] == ["h1"]
    assert [e.id for e in select(root, ".nav")] == ["home", "catalogue-link"]
    assert [e.id for e in select(root, "button.btn.primary#hello")] == ["hello"]
    assert [e.id for e in select(root, "nav a#home")] == ["home"]
    assert select(root, "body nav p") == []
    assert len(select(root, "*")) > 5


@pytest.mark.parametrize("selector", ["a > b", "[href]", "a:hover", "a, b", ""])
def test_unsupported_selectors_are_refused(selector: str) -> None:
    """Selectors outside the documented subset raise SelectorError."""
    with pytest.raises(SelectorError, match=r"^unsupported selector"):
        select(parse_html("<p>x</p>"), selector)


def test_text_collapses_whitespace_and_skips_scripts() -> None:
    """Element text collapses whitespace; script/style content is not visible text."""
    root = parse_html("<div id=d>  one\n <b>two</b><script>x=1</script>  three </div>")
    assert select(root, "#d")[0].text() == "one two three"
    assert visible_lines(root) == ["one two three"]


def test_render_is_a_deterministic_pgm() -> None:
    """render_pgm draws an 80x24 viewport as a binary PGM; equal text, equal bytes."""
    lines = visible_lines(parse_html(DEMO_PAGES["/catalogue"]))
    image = render_pgm(lines, scroll=3)
    assert image.startswith(b"P5\n640 192\n255\n")
    assert len(image) == len(b"P5\n640 192\n255\n") + 640 * 192
    assert image == render_pgm(list(lines), scroll=3)
    assert image != render_pgm(lines, scroll=4)


# --------------------------------------------------------------------------- web executor


@pytest.fixture
def socket_path() -> Iterator[Path]:
    """A short socket path (AF_UNIX paths are limited to 108 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="hh-ex-"))
    try:
        yield directory / "ex.sock"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def pages() -> Iterator[PageServer]:
    """The demo page server on loopback."""
    with PageServer() as server:
        server.set_page(
            "/long", "<ul>" + "".join(f"<li>row {n}</li>" for n in range(100)) + "</ul>"
        )
        yield server


@asynccontextmanager
async def web_hub(path: Path, executor: WebExecutor) -> AsyncIterator[ExecutorHub]:
    hub = ExecutorHub(settings=HubSettings())
    listener = await open_executor_listener(path)
    async with anyio.create_task_group() as tg:
        await tg.start(hub.serve, listener)
        tg.start_soon(lambda: run_executor(executor, socket_path=path))
        with anyio.fail_after(10):
            await hub.wait_for_executor(executor.executor_id)
        try:
            yield hub
        finally:
            with anyio.CancelScope(shield=True):
                await hub.aclose()
                await listener.aclose()
            tg.cancel_scope.cancel()


_ids = iter(range(1, 1_000_000))


def cmd(command: str, **fields: Any) -> ExecutorInstructionEnvelope:
    return build_executor_instruction(
        instruction_id=f"web-{next(_ids)}",
        execution_id="exe-web",
        command_type=command,
        timestamp="2026-01-01T00:00:00Z",
        timeout_ms=5000,
        **fields,
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
    return body


def _ok(report: AttemptReport) -> dict[str, Any]:
    assert report.outcome.kind is OutcomeKind.SUCCESS, report
    assert report.response is not None
    return dict(report.response.output)


async def test_web_executor_evidence_hashes_are_real(socket_path: Path, pages: PageServer) -> None:
    """Every command's evidence hash is the sha256 of what it fetched, read or rendered."""
    executor = WebExecutor(executor_id="web-1")
    async with web_hub(socket_path, executor) as hub:
        nav = await hub.run_attempt(cmd("NAVIGATE", target_url=pages.url("/")))
        read = await hub.run_attempt(cmd("READ", target_selector="#title"))
        shot = await hub.run_attempt(cmd("SCREENSHOT"))
        click = await hub.run_attempt(cmd("CLICK", target_selector="#catalogue-link"))
        scroll = await hub.run_attempt(cmd("SCROLL", parameters={"lines": 10}))
        extract = await hub.run_attempt(
            cmd("EXTRACT", target_selector="li.item", parameters={"attribute": "data-sku"})
        )
        press = await hub.run_attempt(cmd("CLICK", target_selector="a#back"))
        button = await hub.run_attempt(cmd("CLICK", target_selector="#hello"))
    home = await anyio.to_thread.run_sync(_fetch, pages.url("/"))
    catalogue = await anyio.to_thread.run_sync(_fetch, pages.url("/catalogue"))

    assert _ok(nav) == {
        "url": pages.url("/"),
        "status": 200,
        "title": "Hunter demo",
        "bytes": len(home),
    }
    assert nav.response is not None
    assert nav.response.evidence_hash == sha(home)

    assert _ok(read)["text"] == "Welcome to the demo site"
    assert read.response is not None
    assert read.response.evidence_hash == sha(b"Welcome to the demo site")

    home_lines = visible_lines(parse_html(home.decode()))
    assert _ok(shot)["width"] == 640
    assert shot.response is not None
    assert shot.response.evidence_hash == sha(render_pgm(home_lines))

    assert _ok(click)["navigated"] is True
    assert click.response is not None
    assert click.response.evidence_hash == sha(catalogue)

    visible = "\n".join(visible_lines(parse_html(catalogue.decode()))[10:34])
    assert _ok(scroll)["scroll"] == 10
    assert scroll.response is not None
    assert scroll.response.evidence_hash == sha(visible.encode())

    items = _ok(extract)["items"]
    assert list(items[:2]) == ["SKU-001", "SKU-002"]
    assert len(items) == 60
    assert extract.response is not None
    expected = "[" + ",".join(f'"SKU-{n:03d}"' for n in range(1, 61)) + "]"
    assert extract.response.evidence_hash == sha(expected.encode())

    assert _ok(press)["url"] == pages.url("/")
    assert _ok(button) == {"navigated": False, "text": "Say hello"}
    assert button.response is not None
    assert button.response.evidence_hash == sha(b"click #hello: Say hello")


async def test_web_executor_failures_and_refusals(socket_path: Path, pages: PageServer) -> None:
    """No page yet / no match / HTTP 404 → FAILURE; foreign host / bad selector → REFUSED."""
    executor = WebExecutor(executor_id="web-2")
    async with web_hub(socket_path, executor) as hub:
        before = await hub.run_attempt(cmd("READ", target_selector="#title"))
        missing = await hub.run_attempt(cmd("NAVIGATE", target_url=pages.url("/nope")))
        foreign = await hub.run_attempt(cmd("NAVIGATE", target_url="http://example.com/"))
        await hub.run_attempt(cmd("NAVIGATE", target_url=pages.url("/")))
        nomatch = await hub.run_attempt(cmd("READ", target_selector=".absent"))
        bad = await hub.run_attempt(cmd("READ", target_selector="a > b"))
    assert before.outcome.kind is OutcomeKind.FAILURE
    assert before.outcome.message == "no page is loaded: NAVIGATE first"
    assert missing.outcome.kind is OutcomeKind.FAILURE
    assert missing.outcome.message.endswith("answered HTTP 404")
    assert foreign.outcome.kind is OutcomeKind.REFUSED
    assert "not allowed" in foreign.outcome.message
    assert nomatch.outcome.kind is OutcomeKind.FAILURE
    assert bad.outcome.kind is OutcomeKind.REFUSED


async def test_web_executor_extract_beyond_max_items_is_partial(
    socket_path: Path, pages: PageServer
) -> None:
    """EXTRACT with more matches than max_items returns the first ones marked partial."""
    executor = WebExecutor(executor_id="web-3")
    async with web_hub(socket_path, executor) as hub:
        await hub.run_attempt(cmd("NAVIGATE", target_url=pages.url("/long")))
        report = await hub.run_attempt(
            cmd("EXTRACT", target_selector="li", parameters={"max_items": 10})
        )
    assert report.outcome.fault_type is ExecutionFaultType.PARTIAL
    assert report.response is not None
    assert report.response.output["count"] == 10
    assert report.response.output["matches"] == 100


async def test_web_executor_runs_as_a_process_with_its_own_pages(socket_path: Path) -> None:
    """`python -m supervisor.examples.web_executor --serve-pages` connects and serves pages."""
    hub = ExecutorHub(settings=HubSettings())
    listener = await open_executor_listener(socket_path)
    argv = [sys.executable, "-m", "supervisor.examples.web_executor", "--socket", str(socket_path)]
    argv += ["--id", "web-proc", "--serve-pages"]
    async with anyio.create_task_group() as tg:
        await tg.start(hub.serve, listener)
        process = await anyio.open_process(
            argv, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            assert process.stdout is not None
            with anyio.fail_after(20):
                base = (await process.stdout.receive()).decode().strip()
                await hub.wait_for_executor("web-proc")
            report = await hub.run_attempt(cmd("NAVIGATE", target_url=base + "/catalogue"))
            title = await hub.run_attempt(cmd("READ", target_selector="h1"))
        finally:
            process.terminate()
            await process.wait()
            await process.aclose()
            await hub.aclose()
            await listener.aclose()
            tg.cancel_scope.cancel()
    assert base.startswith("http://127.0.0.1:")
    assert report.outcome.kind is OutcomeKind.SUCCESS
    assert title.response is not None
    assert title.response.output["text"] == "Catalogue"
    assert process.returncode == 0  # SIGTERM is a clean stop


# --------------------------------------------------------------------------- chaos executor


def test_behaviour_specs_parse() -> None:
    """'READ=crash,ok' targets one command; a bare list applies to every command."""
    assert parse_behaviour_spec("READ=crash,ok") == ("READ", ("crash", "ok"))
    assert parse_behaviour_spec(" hang ") == ("*", ("hang",))


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ("FLY=ok", r"^unknown command type 'FLY'"),
        ("READ=", r"^behaviour spec 'READ=' names no behaviour$"),
        ("explode", r"^unknown behaviour\(s\) explode in 'explode'$"),
    ],
)
def test_bad_behaviour_specs_are_refused(spec: str, pattern: str) -> None:
    """Unknown commands or behaviours are refused with the offending part."""
    with pytest.raises(ValueError, match=pattern):
        parse_behaviour_spec(spec)


def test_chaos_cli_exits_2_on_a_bad_spec(capsys: pytest.CaptureFixture[str]) -> None:
    """The chaos executor's command line exits 2 with a message for a bad spec."""
    code = chaos_executor.main(["--socket", "x.sock", "--id", "c", "--behaviour", "explode"])
    assert code == 2
    assert "unknown behaviour(s) explode" in capsys.readouterr().err


def test_chaos_plan_sequences_and_probability() -> None:
    """The n-th instruction gets the n-th step (last repeats); probability gates misbehaviour."""
    plan = ChaosPlan({"READ": ("error", "ok"), "*": ("hang",)}, probability=0.5)
    read, nav = ExecutorCommandType.READ, ExecutorCommandType.NAVIGATE
    assert [plan.behaviour(read, i, 0.0) for i in range(3)] == ["error", "ok", "ok"]
    assert plan.behaviour(nav, 7, 0.4) == "hang"
    assert plan.behaviour(nav, 7, 0.6) == "ok"


async def test_chaos_cli_exits_4_when_the_daemon_is_unreachable(socket_path: Path) -> None:
    """With --no-reconnect and no daemon socket, the executor exits 4 with a message."""
    argv = [sys.executable, "-m", "supervisor.examples.chaos_executor", "--socket"]
    argv += [str(socket_path), "--id", "lonely", "--no-reconnect"]
    result = await anyio.run_process(argv, check=False)
    assert result.returncode == 4
    assert b"cannot reach the daemon" in result.stderr
