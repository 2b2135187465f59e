"""The console's error pages over real HTTP against a real daemon: an unknown path, a turn or a
session the daemon does not have, a decision it refuses: each is the console's one styled
error page, in a web user's words (what is missing, a link to where to look), never a command
line's advice; and the overview's retry budget says "on" or "off", not a Python literal."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.console.test_console_http import csrf_of, refused_page, sign_in, started


def in_web_words(answer: httpx.Response) -> None:
    """No advice to run a command: the page speaks to a browser's user."""
    assert "`hunter" not in answer.text
    assert "hunter status" not in answer.text


async def test_an_unknown_path_is_the_styled_not_found_page(root: Path, operators: Path) -> None:
    """Whether signed in or not, a path with no page is the console's 404 page with a link to
    the overview, never a bare text "Not Found"."""
    async with started(root, operators) as live, httpx.AsyncClient(base_url=live.url) as http:
        for signed_in in (False, True):
            if signed_in:
                await sign_in(http, "alice")
            for path in ("/nope", "/turns/7/nope", "/sessions/x/y/z", "/static-nope"):
                answer = await http.get(path)
                refused_page(answer, 404, "not found")
                assert "There is no page at this address." in answer.text
                assert '<a href="/">Go to the overview</a>' in answer.text
                in_web_words(answer)


async def test_what_the_daemon_lacks_is_said_in_web_words(root: Path, operators: Path) -> None:
    """A turn or a session the daemon does not have is a 404 page naming it, with a link to
    the list to look in; a cancel of a turn it does not have is the same page."""
    async with started(root, operators) as live, httpx.AsyncClient(base_url=live.url) as http:
        await sign_in(http, "alice")
        answer = await http.get("/turns/9223372036854775807")
        refused_page(answer, 404, "not found")
        assert "There is no turn 9223372036854775807 in this daemon." in answer.text
        assert '<a href="/turns">See the turns</a>' in answer.text
        in_web_words(answer)
        unknown = live.session_id[:-16] + "0" * 16
        answer = await http.get(f"/sessions/{unknown}")
        refused_page(answer, 404, "not found")
        assert f"There is no session {unknown} in this daemon." in answer.text
        assert '<a href="/sessions">See the sessions</a>' in answer.text
        in_web_words(answer)
        csrf = csrf_of((await http.get("/escalations")).text)
        answer = await http.post(
            "/turns/424242/cancel",
            data={"csrf": csrf, "reason": "not ours"},
            headers={"origin": live.url},
        )
        refused_page(answer, 404, "not found")
        assert "There is no turn 424242 in this daemon." in answer.text
        in_web_words(answer)


async def test_the_retry_budget_says_on_or_off(root: Path, operators: Path) -> None:
    """The overview's retry-budget section says whether the budget is on in words."""
    async with started(root, operators) as live, httpx.AsyncClient(base_url=live.url) as http:
        await sign_in(http, "rita")
        enabled = (await live.client.call("status"))["retry_budget"]["enabled"]
        overview = await http.get("/")
        assert overview.status_code == 200
        section = overview.text.partition("<h2>Retry budget</h2>")[2].partition("</table>")[0]
        shown = re.search(r"<tr><th>enabled</th><td>([^<]*)</td></tr>", section)
        assert shown is not None, section
        assert shown.group(1) == ("on" if enabled else "off")
        assert "True" not in section
        assert "False" not in section
