"""The console in a real browser (Debian's chromium, headless, through chromedriver) against a
real daemon with a real executor: sign in, watch a running turn become succeeded without a
reload, read its timeline, resolve an escalation as a resolver and see the ledger entry, be
refused as a reader, with no sign-in and with a bad CSRF token, and see a ``<script>`` payload
shown as text.

With ``HUNTER_CONSOLE_SCREENSHOTS=DIR`` the screenshots of the overview, a turn and the
escalation queue are written to DIR (docs/console/ holds the committed ones).
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import msgspec
import pytest

from supervisor.mcp.attribution import ServerInstance, requested_by
from supervisor.sdk import Executor, Instruction, Result
from tests.console.browser import Browser, browser, missing_reason
from tests.console.live_console import PASSWORDS, console_for
from tests.live_daemon import WAIT_S

pytestmark = pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))


class Pages(Executor):
    """READ answers at once, except ``#slow``, which waits for ``gate``."""

    def __init__(self) -> None:
        super().__init__(executor_id="pages", slots=4)
        self.gate = anyio.Event()
        self.waiting = anyio.Event()

    async def read(self, instruction: Instruction) -> Result:
        if instruction.target_selector == "#slow":
            self.waiting.set()
            await self.gate.wait()
        return Result.success(f"page {instruction.target_selector}", attach_evidence=True)


def shots(tmp_path: Path) -> Path:
    wanted = os.environ.get("HUNTER_CONSOLE_SCREENSHOTS")
    return Path(wanted) if wanted else tmp_path / "shots"


async def sign_in(page: Browser, name: str) -> None:
    await page.open("/login")
    await page.type("input[name=name]", name)
    await page.type("input[name=password]", PASSWORDS[name])
    await page.click("button[type=submit]")
    await page.wait_text("header .operator", name)


async def test_a_resolver_follows_turns_live_and_resolves_an_escalation(
    root: Path, operators: Path, tmp_path: Path
) -> None:
    executor = Pages()
    out = shots(tmp_path)
    async with console_for(root, executor, operators) as live, browser(live.url) as page:
        # no sign-in: the sign-in form, then back where the browser was going
        await page.open("/escalations")
        assert "/login?next=%2Fescalations" in await page.url()
        await page.type("input[name=name]", "alice")
        await page.type("input[name=password]", PASSWORDS["alice"])
        await page.click("button[type=submit]")
        await page.wait_text("h1", "Escalations")

        # a running turn becomes succeeded on the open page, with no reload
        for n in range(3):
            await live.read(f"#done-{n}")
        slow = await live.read("#slow", wait=False)
        with anyio.fail_after(WAIT_S):
            await executor.waiting.wait()
        await page.open(f"/turns/{slow['turn_id']}")
        await page.wait_text("#turn-state", "running")
        await page.wait_text("#live", "●")  # the live stream is open
        await page.script("window.__sameDocument = 'yes'")
        executor.gate.set()
        await page.wait_text("#turn-state", "succeeded")
        assert await page.script("return window.__sameDocument") == "yes"  # not reloaded
        timeline = await page.text(".timeline")
        assert "accepted" in timeline
        assert "attempt 1 on pages" in timeline
        assert "decision: SUCCEED" in timeline
        assert "ATTEMPT_SUCCEEDED" in timeline
        assert "evidence" in await page.text(".ledger")
        await page.screenshot(out / "turn.png")

        # an escalation appears in the queue without a reload; resolved with a reason
        await page.open("/escalations")
        turn_id = await live.escalate()
        await page.wait_text(f"#escalation-{turn_id}", "RESOURCE_EXHAUSTED")
        await page.screenshot(out / "escalations.png")
        await page.type(f"#escalation-{turn_id} input[name=reason]", "asks for 512 MiB")
        await page.click(f"#escalation-{turn_id} button[value=terminate]")
        await page.wait_text("#turn-state", "terminated")
        decided = await page.text(".decided")
        assert "Decided by alice" in decided
        assert "asks for 512 MiB" in decided
        ledger = await page.text(".ledger")
        assert "alice: asks for 512 MiB" in ledger  # the evidence entry names who decided

        await page.open("/")
        await page.wait_text("h1", "Overview")
        await page.wait_text(".chartbox", "turns/s")
        overview = await page.text()
        assert "executors" in overview
        assert "Retry budget" in overview
        assert "Sandbox enforcement" in overview
        await page.screenshot(out / "overview.png")
        assert await page.console_errors() == []  # no script error, nothing the CSP refused
    for name in ("overview.png", "turn.png", "escalations.png"):
        assert (out / name).stat().st_size > 10_000, name


async def test_a_reader_is_refused_and_so_is_a_bad_csrf_token(root: Path, operators: Path) -> None:
    async with console_for(root, Pages(), operators) as live:
        turn_id = await live.escalate()
        async with browser(live.url) as reader:
            await sign_in(reader, "rita")
            await reader.open("/escalations")
            await reader.wait_text(f"#escalation-{turn_id}", "RESOURCE_EXHAUSTED")
            assert not await reader.all("form.decide")  # nothing offered to a reader
            # a reader who posts the form anyway (the page's own CSRF token) is refused
            status = await reader.script(
                """
                const csrf = document.querySelector("input[name=csrf]").value;
                const body = new URLSearchParams({csrf, action: "terminate", reason: "mine"});
                const r = await fetch(arguments[0], {method: "POST", body});
                return r.status;
                """,
                f"/escalations/{turn_id}/resolve",
            )
            assert status == 403
        async with browser(live.url) as resolver:
            await sign_in(resolver, "alice")
            await resolver.open("/escalations")
            await resolver.wait_text(f"#escalation-{turn_id}", "RESOURCE_EXHAUSTED")
            # a form whose token was tampered with is refused, and nothing changes
            await resolver.script(
                "document.querySelector('form.decide input[name=csrf]').value = 'forged'"
            )
            await resolver.type(f"#escalation-{turn_id} input[name=reason]", "forged")
            await resolver.click(f"#escalation-{turn_id} button[value=terminate]")
            # the refusal is the next page: wait for it (read at once, the old page may be gone)
            await resolver.wait_text("body", "CSRF token is missing or wrong")
        got = await live.client.call("turn.get", turn_id=turn_id)
        assert got["turn"]["state"] == "escalated"


async def test_a_script_in_a_turn_is_shown_as_text(root: Path, operators: Path) -> None:
    payload = "<script>document.title='owned'</script><img src=x onerror=\"document.title='x'\">"
    async with console_for(root, Pages(), operators) as live, browser(live.url) as page:
        turn = await live.read(payload)
        await sign_in(page, "rita")
        for path in (f"/turns/{turn['turn_id']}", "/turns", f"/sessions/{live.session_id}"):
            await page.open(path)
            await page.wait_text("main", "<script>document.title='owned'</script>")
            assert "owned" not in await page.title()
            assert await page.title() != "x"
            assert not await page.all("main script")
            assert not await page.all("main img")

        # a turn an agent asked for through `hunter mcp` names who asked, as text too
        asked = requested_by(
            ServerInstance(name="hunter-mcp", version="0.1.0", uid=1000, pid=4242),
            "<b>agent</b>",
            "2.0",
        )
        answer = await live.client.call(
            "turn.submit",
            session_id=live.session_id,
            kind="instruction",
            command_type="READ",
            target_selector="h1",
            declared_outputs=[],
            requested_by=msgspec.to_builtins(asked),
            wait_s=WAIT_S,
        )
        await page.open(f"/turns/{answer['turn']['turn_id']}")
        row = await page.wait_text("main", "requested by")
        assert "<b>agent</b> 2.0 via mcp (hunter-mcp 0.1.0, uid 1000, pid 4242)" in row
        assert not await page.all("main b")


async def test_every_page_renders_with_no_error_in_the_browser(root: Path, operators: Path) -> None:
    """Overview, sessions, a session, turns, a turn, escalations and executors each render
    what they are for, and the browser logs no error on any (no script error, nothing the
    Content-Security-Policy refused, no failed request)."""
    async with console_for(root, Pages(), operators) as live, browser(live.url) as page:
        turn = await live.read("#every-page")
        await sign_in(page, "rita")
        checks = {
            "/": ("h1", "Overview"),
            "/sessions": ("main", live.session_id),
            f"/sessions/{live.session_id}": (".capabilities", "/etc/shadow"),
            "/turns": ("main", "#every-page"),
            f"/turns/{turn['turn_id']}": (".timeline", "decision: SUCCEED"),
            "/escalations": ("main", "no turn waits for an operator"),
            "/executors": ("main", "pages"),
        }
        for path, (css, wanted) in checks.items():
            await page.open(path)
            await page.wait_text(css, wanted)
            await page.wait_text("#live", "●")  # its live stream opened
            assert await page.console_errors() == [], path
        executors = await page.text("main")
        assert "READ" in executors
        assert "ago" in executors  # the executor's last heartbeat
