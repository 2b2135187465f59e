"""The console over real HTTP against a real daemon: who may see and change what, and the
attacks a browser (or a script posing as one) can try: no sign-in, a wrong password and
guessing, a forged or missing CSRF token, a foreign Origin, a reader deciding, a huge form,
markup in a turn's spec, an open redirect after signing in, a foreign ``Host`` (and a redirect
built from it), a decision posted as ``text/plain``, and ids that nothing can have (a turn id
past 64 bits, a 5,000-character session id) on every route that takes one.

Each test starts an in-process daemon with an executor and the console on a free loopback
port (`tests.console.live_console`), and talks to it with httpx as a browser would.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from supervisor.sdk import Executor, Instruction, Result
from tests.console.live_console import PASSWORDS, LiveConsole, console_for
from tests.live_daemon import WAIT_S


class Echo(Executor):
    def __init__(self) -> None:
        super().__init__(executor_id="echo", slots=4)

    async def read(self, instruction: Instruction) -> Result:
        return Result.success(f"page {instruction.target_selector}", attach_evidence=True)


@asynccontextmanager
async def started(
    root: Path, operators: Path, *, allowed_hosts: tuple[str, ...] = ()
) -> AsyncIterator[LiveConsole]:
    """The console of a fresh daemon (an async context manager in the test's own task: the
    daemon's and the console's task groups cannot span a fixture's setup and teardown)."""
    async with console_for(root, Echo(), operators, allowed_hosts=allowed_hosts) as console:
        await until_linked(console.url)
        yield console


async def until_linked(url: str) -> None:
    async with httpx.AsyncClient(base_url=url) as http:
        await healthy(http)


async def healthy(http: httpx.AsyncClient) -> None:
    """Return once the console answers /healthz with 200 (it reaches the daemon)."""
    with anyio.fail_after(WAIT_S):
        while True:
            if (await http.get("/healthz")).status_code == 200:
                return
            await anyio.sleep(0.05)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


async def sign_in(
    http: httpx.AsyncClient, name: str, password: str | None = None
) -> httpx.Response:
    form = await http.get("/login")
    token = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert token, form.text
    return await http.post(
        "/login",
        data={
            "form_token": token.group(1),
            "name": name,
            "password": PASSWORDS.get(name, "") if password is None else password,
            "next": "/escalations",
        },
    )


async def test_every_page_needs_a_sign_in(root: Path, operators: Path) -> None:
    """Without a sign-in a page sends the browser to the sign-in form (remembering where it
    was going), and a POST or the live stream is refused outright; /healthz tells only up or
    down."""
    async with started(root, operators) as live, httpx.AsyncClient(base_url=live.url) as http:
        for path in ("/", "/sessions", "/turns", "/turns/1", "/escalations", "/executors"):
            answer = await http.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"].startswith("/login?next=")
        assert (await http.get("/events")).status_code == 401
        assert (await http.post("/turns/1/cancel", data={"reason": "x"})).status_code == 401
        health = await http.get("/healthz")
        assert health.json() == {"daemon": "up"}


async def test_sign_in_and_out(root: Path, operators: Path) -> None:
    """The right password signs in (an HttpOnly, SameSite=Strict cookie; back to where the
    browser was going); signing out ends the sign-in on the server, so the old cookie is
    worthless."""
    async with started(root, operators) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:
            done = await sign_in(http, "alice")
            assert done.status_code == 303
            assert done.headers["location"] == "/escalations"
            cookie = done.headers["set-cookie"]
            assert "HttpOnly" in cookie
            assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
            page = await http.get("/")
            assert page.status_code == 200
            assert "alice" in page.text
            assert "resolver" in page.text
            old = dict(http.cookies)
            out = await http.post("/logout", data={"csrf": csrf_of(page.text)})
            assert out.status_code == 303
        async with httpx.AsyncClient(base_url=live.url, cookies=old) as replay:
            assert (await replay.get("/")).status_code == 303


async def test_wrong_passwords_are_refused_then_rate_limited(root: Path, operators: Path) -> None:
    """A wrong password or an unknown name gets the same 401; after five failures in a minute
    the name is refused with 429 and Retry-After even with the right password, and so is the
    address for any name."""
    async with started(root, operators) as live, httpx.AsyncClient(base_url=live.url) as http:
        unknown = await sign_in(http, "mallory", "guess")
        assert unknown.status_code == 401
        assert "Wrong name or password" in unknown.text
        for attempt in range(4):
            wrong = await sign_in(http, "alice", f"guess {attempt}")
            assert wrong.status_code == 401
        limited = await sign_in(http, "alice")
        assert limited.status_code == 429
        assert int(limited.headers["retry-after"]) > 0
        assert "Too many failed sign-ins" in limited.text
        # the address is limited too: another operator from here waits as well
        assert (await sign_in(http, "rita")).status_code == 429


async def test_sign_in_form_needs_its_cookie(root: Path, operators: Path) -> None:
    """A sign-in posted from elsewhere (no form cookie: login CSRF) is refused."""
    async with started(root, operators) as live, httpx.AsyncClient(base_url=live.url) as http:
        answer = await http.post(
            "/login", data={"form_token": "x", "name": "alice", "password": PASSWORDS["alice"]}
        )
        assert answer.status_code == 403
        assert "The form expired" in answer.text


async def test_no_open_redirect_after_sign_in(root: Path, operators: Path) -> None:
    async with started(root, operators) as live:
        for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
            async with httpx.AsyncClient(base_url=live.url) as http:
                form = await http.get("/login")
                token = re.search(r'name="form_token" value="([^"]+)"', form.text)
                assert token
                answer = await http.post(
                    "/login",
                    data={
                        "form_token": token.group(1),
                        "name": "alice",
                        "password": PASSWORDS["alice"],
                        "next": target,
                    },
                )
                assert answer.status_code == 303
                assert answer.headers["location"] == "/", target


async def test_a_resolver_resolves_with_a_reason_recorded_in_the_ledger(
    root: Path, operators: Path
) -> None:
    """A resolver's terminate is the signed-in operator's decision: the turn's result and its
    evidence ledger entry name alice and the reason, and the turn page shows them."""
    async with started(root, operators) as live:
        turn_id = await live.escalate()
        async with httpx.AsyncClient(base_url=live.url) as http:
            await sign_in(http, "alice")
            page = await http.get("/escalations")
            assert f'id="escalation-{turn_id}"' in page.text
            no_reason = await http.post(
                f"/escalations/{turn_id}/resolve",
                data={"csrf": csrf_of(page.text), "action": "terminate", "reason": "  "},
            )
            assert no_reason.status_code == 400
            done = await http.post(
                f"/escalations/{turn_id}/resolve",
                data={"csrf": csrf_of(page.text), "action": "terminate", "reason": "too big"},
            )
            assert done.status_code == 303
            assert done.headers["location"] == f"/turns/{turn_id}?done=terminate"
            shown = await http.get(done.headers["location"])
            assert "terminated" in shown.text
            assert "Decided by <strong>alice</strong>" in shown.text
        got = await live.client.call("turn.get", turn_id=turn_id)
        decided = got["turn"]["result"]["decided_by"]
        assert (decided["operator"], decided["reason"], decided["action"]) == (
            "alice",
            "too big",
            "terminate",
        )
        assert got["ledger"]["evidence"][-1]["decided_by"] == decided


async def test_a_reader_may_look_but_not_decide(root: Path, operators: Path) -> None:
    async with started(root, operators) as live:
        turn_id = await live.escalate()
        async with httpx.AsyncClient(base_url=live.url) as http:
            await sign_in(http, "rita")
            page = await http.get("/escalations")
            assert page.status_code == 200
            assert f'id="escalation-{turn_id}"' in page.text
            assert "/resolve" not in page.text  # no form offered
            csrf = csrf_of(page.text)  # the sign-out form's
            refused = await http.post(
                f"/escalations/{turn_id}/resolve",
                data={"csrf": csrf, "action": "terminate", "reason": "because"},
            )
            assert refused.status_code == 403
            assert "reader" in refused.text
            cancel = await http.post(f"/turns/{turn_id}/cancel", data={"csrf": csrf, "reason": "x"})
            assert cancel.status_code == 403
        assert (await live.client.call("turn.get", turn_id=turn_id))["turn"]["state"] == "escalated"


async def test_forged_requests_are_refused(root: Path, operators: Path) -> None:
    """A POST without the CSRF token, with another sign-in's token, or from a foreign Origin
    changes nothing."""
    async with started(root, operators) as live:
        turn_id = await live.escalate()
        async with httpx.AsyncClient(base_url=live.url) as other:
            await sign_in(other, "rita")
            foreign_token = csrf_of((await other.get("/")).text)
        async with httpx.AsyncClient(base_url=live.url) as http:
            await sign_in(http, "alice")
            own = csrf_of((await http.get("/escalations")).text)
            url = f"/escalations/{turn_id}/resolve"
            form = {"action": "terminate", "reason": "forged"}
            assert (await http.post(url, data=form)).status_code == 403
            assert (await http.post(url, data={**form, "csrf": foreign_token})).status_code == 403
            cross = await http.post(
                url, data={**form, "csrf": own}, headers={"origin": "https://evil.example"}
            )
            assert cross.status_code == 403
            assert "evil.example" in cross.text
            huge = await http.post(url, content=b"a=" + b"x" * 100_000)
            assert huge.status_code == 413
        assert (await live.client.call("turn.get", turn_id=turn_id))["turn"]["state"] == "escalated"


async def test_markup_in_a_turn_is_shown_as_text(root: Path, operators: Path) -> None:
    """A selector holding a <script> tag (and an executor's output echoing it) is escaped on
    every page that shows it, and the Content-Security-Policy forbids inline script anyway."""
    async with started(root, operators) as live:
        payload = '<script>alert("owned")</script><img src=x onerror=alert(1)>'
        submitted = await live.client.call(
            "turn.submit",
            session_id=live.session_id,
            kind="instruction",
            command_type="READ",
            target_selector=payload,
            declared_outputs=[],
            wait_s=WAIT_S,
        )
        turn_id = submitted["turn"]["turn_id"]
        assert submitted["turn"]["state"] == "succeeded"
        async with httpx.AsyncClient(base_url=live.url) as http:
            await sign_in(http, "rita")
            for path in (f"/turns/{turn_id}", "/turns", f"/sessions/{live.session_id}"):
                page = await http.get(path)
                assert page.status_code == 200
                assert "<script>alert" not in page.text, path
                assert "&lt;script&gt;alert(&#34;owned&#34;)&lt;/script&gt;" in page.text, path
                assert "<img src=x" not in page.text
                csp = page.headers["content-security-policy"]
                assert "script-src 'self'" in csp
                assert "unsafe-inline" not in csp
                assert page.headers["x-frame-options"] == "DENY"
                assert page.headers["cache-control"] == "no-store"


async def test_evidence_download_is_the_bytes_the_executor_sent(
    root: Path, operators: Path
) -> None:
    async with started(root, operators) as live:
        import hashlib

        submitted = await live.client.call(
            "turn.submit",
            session_id=live.session_id,
            kind="instruction",
            command_type="READ",
            target_selector="#evidence",
            declared_outputs=[],
            wait_s=WAIT_S,
        )
        turn = submitted["turn"]
        async with httpx.AsyncClient(base_url=live.url) as http:
            await sign_in(http, "rita")
            page = await http.get(f"/turns/{turn['turn_id']}")
            assert f"/turns/{turn['turn_id']}/evidence" in page.text
            got = await http.get(f"/turns/{turn['turn_id']}/evidence")
        assert got.status_code == 200
        assert got.content == b"page #evidence"
        assert hashlib.sha256(got.content).hexdigest() == turn["result"]["evidence_hash"]
        assert "attachment" in got.headers["content-disposition"]


async def test_the_live_stream_pushes_a_turns_changes(root: Path, operators: Path) -> None:
    """A page following a session is told over Server-Sent Events that it changed, as it
    happens: every change counted, bursts in one message."""
    async with (
        started(root, operators) as live,
        httpx.AsyncClient(base_url=live.url, timeout=WAIT_S) as http,
    ):
        await sign_in(http, "rita")
        messages: list[dict[str, object]] = []
        with anyio.fail_after(WAIT_S):
            async with http.stream("GET", f"/events?session={live.session_id}") as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                submitted = await live.client.call(
                    "turn.submit",
                    session_id=live.session_id,
                    kind="instruction",
                    command_type="READ",
                    target_selector="#live",
                    declared_outputs=[],
                )
                assert submitted["turn"]["state"] in {"accepted", "running", "succeeded"}
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        messages.append(json.loads(line[6:]))
                        if messages[-1]["kind"] == "turn.ended":
                            break
        # the turn's four events, in one message or several (a burst is one message)
        assert sum(int(str(m["changes"])) for m in messages) == 4
        assert re.fullmatch(r"[0-9a-f]+:[0-9]+", str(messages[-1]["cursor"]))


async def test_a_bad_stream_filter_is_refused(root: Path, operators: Path) -> None:
    async with started(root, operators) as live, httpx.AsyncClient(base_url=live.url) as http:
        await sign_in(http, "rita")
        answer = await http.get("/events?turn=1;drop")
        assert answer.status_code == 400


async def test_proxy_header_is_refused_on_tcp(root: Path, operators: Path) -> None:
    """--user-header on a TCP port would let anyone name themselves: refused at start."""
    from supervisor.console.errors import ConsoleError
    from supervisor.console.operators import load_operators
    from supervisor.console.server import parse_listen, run_console
    from supervisor.console.state import ConsoleSettings

    settings = ConsoleSettings(
        socket=root / "run" / "control.sock",
        operators=load_operators(operators),
        user_header="X-User",
    )
    with pytest.raises(ConsoleError, match="only with --listen unix:PATH"):
        await run_console(settings, parse_listen("127.0.0.1:0"), handle_signals=False)


async def test_proxy_header_on_a_unix_socket(root: Path, operators: Path, tmp_path: Path) -> None:
    """Behind a proxy on a Unix socket the header names the operator (their role from the
    file); no header, or a name that is no operator, is refused."""
    sock = tmp_path / "console.sock"
    async with console_for(
        root, Echo(), operators, listen=f"unix:{sock}", user_header="X-Remote-User"
    ):
        transport = httpx.AsyncHTTPTransport(uds=str(sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as http:
            await healthy(http)
            assert (await http.get("/")).status_code == 401
            stranger = await http.get("/", headers={"x-remote-user": "mallory"})
            assert stranger.status_code == 403
            page = await http.get("/", headers={"x-remote-user": "proxied"})
            assert page.status_code == 200
            assert "proxied" in page.text
            assert (await http.get("/login")).status_code == 404


async def test_a_session_page_shows_its_package_and_verified_ledgers(
    root: Path, operators: Path
) -> None:
    async with started(root, operators) as live, httpx.AsyncClient(base_url=live.url) as http:
        await live.client.call(
            "turn.submit",
            session_id=live.session_id,
            kind="instruction",
            command_type="READ",
            target_selector="#one",
            declared_outputs=[],
            wait_s=WAIT_S,
        )
        check = await live.client.call("ledger.verify", session_id=live.session_id)
        await sign_in(http, "rita")
        page = await http.get(f"/sessions/{live.session_id}")
        assert page.status_code == 200
        assert "<code>/etc/shadow</code>" in page.text  # forbidden by the demo package
        assert "memory_mb 64" in page.text
        assert "verified" in page.text
        for ledger in check["ledgers"]:
            assert ledger["head_hash"][:16] in page.text
        missing = await http.get("/sessions/SES-nope")
        assert missing.status_code == 404


async def test_without_a_daemon_pages_say_so_and_sign_in_still_works(
    operators: Path, tmp_path: Path
) -> None:
    """A console started before its daemon (or whose daemon went away) serves: sign-in works,
    /healthz answers 503, and a page says the daemon does not answer, naming the socket."""
    from supervisor.console.operators import load_operators
    from supervisor.console.server import parse_listen, run_console
    from supervisor.console.state import ConsoleSettings

    socket = tmp_path / "nowhere" / "control.sock"
    settings = ConsoleSettings(socket=socket, operators=load_operators(operators))
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        url = await tg.start(
            lambda task_status: run_console(
                settings,
                parse_listen("127.0.0.1:0"),
                handle_signals=False,
                stop=stop,
                task_status=task_status,
            )
        )
        try:
            async with httpx.AsyncClient(base_url=url) as http:
                assert (await http.get("/healthz")).status_code == 503
                assert (await sign_in(http, "rita")).status_code == 303
                page = await http.get("/")
                assert page.status_code == 503
                assert "The daemon does not answer" in page.text
                assert str(socket) in page.text
                assert 'data-follow="reconnect"' in page.text
        finally:
            stop.set()


# -- what a request names, what it sends, which ids it carries ---------------------------------

#: what the console's error page looks like (error.html in base.html: its own styles)
STYLED = '<link rel="stylesheet" href="/static/console.css">'


def port_of(url: str) -> int:
    port = httpx.URL(url).port
    assert port is not None, url
    return port


def refused_page(answer: httpx.Response, status: int, title: str) -> None:
    """*answer* is the console's own error page with *status* and *title*."""
    assert answer.status_code == status, (answer.status_code, answer.text[:300])
    assert answer.headers["content-type"].startswith("text/html")
    assert STYLED in answer.text
    assert f"<h1>{title}</h1>" in answer.text
    assert '<p class="message bad">' in answer.text
    assert "script-src 'self'" in answer.headers["content-security-policy"]


async def test_a_foreign_host_is_refused_and_redirects_are_paths(
    root: Path, operators: Path
) -> None:
    """A request naming another host (DNS rebinding, a poisoned redirect) gets the console's
    400 page and never a Location naming it; the console's own names (its address, localhost on
    loopback) are answered, and a trailing slash redirects to a path, not a URL from Host."""
    async with started(root, operators) as live, httpx.AsyncClient(base_url=live.url) as http:
        port = port_of(live.url)
        await sign_in(http, "alice")
        for path in ("/escalations/", "/escalations", "/", "/login", "/healthz", "/nope/"):
            for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}"):
                answer = await http.get(path, headers={"host": host})
                refused_page(answer, 400, "unknown host")
                assert "location" not in answer.headers
                assert "does not answer to" in answer.text
        posted = await http.post("/logout", data={"csrf": "x"}, headers={"host": "evil.example"})
        refused_page(posted, 400, "unknown host")
        for bad in ("", "127.0.0.1:80:1", "[::1", "exa mple", "[zz::1]:1"):
            assert (await http.get("/", headers={"host": bad})).status_code == 400, bad
        for own in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
            assert (await http.get("/", headers={"host": own})).status_code == 200, own
        slash = await http.get("/escalations/", headers={"host": f"localhost:{port}"})
        assert slash.status_code == 307
        assert slash.headers["location"] == "/escalations"
        query = await http.get("/turns//?after=3")
        assert (query.status_code, query.headers["location"]) == (307, "/turns?after=3")
        assert (await http.get("/turns/5/")).headers["location"] == "/turns/5"
        followed = await http.get("/escalations/", follow_redirects=True)
        assert followed.status_code == 200
        assert followed.url == httpx.URL(live.url + "/escalations")
        # a path that would make a Location of //host (another site) is no redirect
        for raw in (b"//evil.example/", b"/%2Fevil.example/", b"/nope/"):
            answer = await http.get(httpx.URL(live.url).copy_with(raw_path=raw))
            refused_page(answer, 404, "not found")
            assert "location" not in answer.headers


async def test_two_host_headers_are_refused(root: Path, operators: Path) -> None:
    """A request with two Host headers (one ours, one not) is not taken for ours."""
    async with started(root, operators) as live:
        port = port_of(live.url)
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(
                b"GET /login HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nHost: evil.example\r\n"
                b"Connection: close\r\n\r\n" % port
            )
            answer = b""
            with anyio.fail_after(WAIT_S):
                async for chunk in stream:
                    answer += chunk
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]


async def test_allowed_host_names(root: Path, operators: Path) -> None:
    """--allow-host adds a name (any port, or the one given); other names stay refused."""
    async with (
        started(root, operators, allowed_hosts=("console.example", "ops.example:8443")) as live,
        httpx.AsyncClient(base_url=live.url) as http,
    ):
        for host in ("console.example", "console.example:443", "Console.Example:8470"):
            assert (await http.get("/login", headers={"host": host})).status_code == 200, host
        assert (await http.get("/login", headers={"host": "ops.example:8443"})).status_code == 200
        for host in ("ops.example", "ops.example:443", "evil.console.example", "evil.example"):
            refused_page(await http.get("/login", headers={"host": host}), 400, "unknown host")
        answer = await http.get("/escalations/", headers={"host": "console.example"})
        assert answer.headers["location"] == "/escalations"


async def test_host_names_on_a_unix_socket(root: Path, operators: Path, tmp_path: Path) -> None:
    """Behind a proxy on a Unix socket with --allow-host, only those names are answered."""
    sock = tmp_path / "console.sock"
    async with console_for(
        root,
        Echo(),
        operators,
        listen=f"unix:{sock}",
        user_header="X-Remote-User",
        allowed_hosts=("console.example",),
    ):
        transport = httpx.AsyncHTTPTransport(uds=str(sock))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://console.example"
        ) as http:
            await healthy(http)
            user = {"x-remote-user": "proxied"}
            assert (await http.get("/", headers=user)).status_code == 200
            for host in ("console", "localhost", "evil.example"):
                answer = await http.get("/", headers={**user, "host": host})
                refused_page(answer, 400, "unknown host")


async def test_a_decision_must_be_a_url_encoded_form(root: Path, operators: Path) -> None:
    """A decision with a valid token and the console's own Origin is still refused (415) when
    its body is not a url-encoded form (text/plain, JSON, multipart, none), and nothing is
    decided; the same fields as a form decide."""
    async with started(root, operators) as live:
        turn_id = await live.escalate()
        async with httpx.AsyncClient(base_url=live.url) as http:
            await sign_in(http, "alice")
            csrf = csrf_of((await http.get("/escalations")).text)
            url = f"/escalations/{turn_id}/resolve"
            body = f"csrf={csrf}&action=terminate&reason=plain"
            own = {"origin": live.url}
            for content_type in (
                "text/plain",
                "text/plain; charset=utf-8",
                "application/json",
                "application/x-www-form-urlencodedx",
                "multipart/form-data; boundary=x",
            ):
                answer = await http.post(
                    url, content=body, headers={**own, "content-type": content_type}
                )
                assert answer.status_code == 415, content_type
                assert "not a form of this console" in answer.text
                assert "application/x-www-form-urlencoded" in answer.text
            bare = await http.post(url, content=body, headers=own)
            assert bare.status_code == 415
            assert "no content type" in bare.text
            multipart = await http.post(
                url,
                data={"csrf": csrf, "action": "terminate", "reason": "multipart"},
                files={"file": ("a.txt", b"x")},
                headers=own,
            )
            assert multipart.status_code == 415
            cancel = await http.post(
                f"/turns/{turn_id}/cancel",
                content=f"csrf={csrf}&reason=plain",
                headers={**own, "content-type": "text/plain"},
            )
            assert cancel.status_code == 415
            got = await live.client.call("turn.get", turn_id=turn_id)
            assert got["turn"]["state"] == "escalated"
            done = await http.post(
                url,
                content=body,
                headers={**own, "content-type": "application/x-www-form-urlencoded"},
            )
            assert done.status_code == 303
            assert done.headers["location"] == f"/turns/{turn_id}?done=terminate"
        got = await live.client.call("turn.get", turn_id=turn_id)
        assert got["turn"]["state"] == "terminated"
        assert got["turn"]["result"]["decided_by"]["reason"] == "plain"


async def test_sign_in_and_out_must_be_url_encoded_forms(root: Path, operators: Path) -> None:
    async with started(root, operators) as live, httpx.AsyncClient(base_url=live.url) as http:
        form = await http.get("/login")
        token = re.search(r'name="form_token" value="([^"]+)"', form.text)
        assert token
        body = f"form_token={token.group(1)}&name=alice&password={PASSWORDS['alice']}"
        plain = await http.post("/login", content=body, headers={"content-type": "text/plain"})
        assert plain.status_code == 415
        assert "supervisor.console" not in http.cookies
        assert (await sign_in(http, "alice")).status_code == 303
        csrf = csrf_of((await http.get("/")).text)
        out = await http.post(
            "/logout", content=f"csrf={csrf}", headers={"content-type": "text/plain"}
        )
        assert out.status_code == 415
        assert (await http.get("/")).status_code == 200  # still signed in


#: turn ids no turn can have: past 64 bits, 2**63, zero, 5,000 digits, not a number at all
BAD_TURNS = (
    "99999999999999999999999",
    "9223372036854775808",
    "0",
    "9" * 5000,
    "abc",
    "%C2%B2",  # "²": a digit to str.isdigit, not to int
)


async def test_turn_ids_nothing_can_have_are_refused_before_the_daemon(
    root: Path, operators: Path
) -> None:
    """On every route that takes a turn id (a page, its evidence, a resolve or cancel, a list's
    ``after``, the live stream), one past 64 bits, zero, thousands of digits or not a number is
    the console's own 404 (in the path) or 400 (a parameter), never the daemon's 500 or 502;
    nothing is decided."""
    async with started(root, operators) as live:
        turn_id = await live.escalate()
        async with httpx.AsyncClient(base_url=live.url) as http:
            await sign_in(http, "alice")
            csrf = csrf_of((await http.get("/escalations")).text)
            decision = {"csrf": csrf, "action": "terminate", "reason": "bad id"}
            for bad in BAD_TURNS:
                for path in (f"/turns/{bad}", f"/turns/{bad}/evidence"):
                    answer = await http.get(path)
                    refused_page(answer, 404, "not found")
                    assert "a turn id is a whole number from 1 to" in answer.text, path
                for path in (f"/escalations/{bad}/resolve", f"/turns/{bad}/cancel"):
                    answer = await http.post(path, data=decision, headers={"origin": live.url})
                    refused_page(answer, 404, "not found")
                for path in ("/turns", "/escalations", f"/sessions/{live.session_id}"):
                    if bad == "0":  # after=0: from the start
                        continue
                    answer = await http.get(f"{path}?after={bad}")
                    refused_page(answer, 400, "bad request")
                    assert "is not a turn id" in answer.text, path
                stream = await http.get(f"/events?turn={bad}")
                assert stream.status_code == 400
                assert stream.text.startswith("turn: no turn")
            for path in ("/turns", "/escalations", f"/sessions/{live.session_id}"):
                assert (await http.get(f"{path}?after=-1")).status_code == 400
                for good in ("", "0", "9223372036854775807"):
                    assert (await http.get(f"{path}?after={good}")).status_code == 200, good
            unknown = await http.get("/turns/9223372036854775807")
            refused_page(unknown, 404, "not found")  # asked: the daemon has no such turn
            assert "a turn id is" not in unknown.text
        got = await live.client.call("turn.get", turn_id=turn_id)
        assert got["turn"]["state"] == "escalated"


async def test_session_and_executor_ids_nothing_can_have_are_refused(
    root: Path, operators: Path
) -> None:
    """A session id of 5,000 characters, or not of the daemon's form, is the console's 404 on
    the session page and 400 on the live stream; an executor cursor past an executor id's
    form is 400; a well-formed id the daemon does not know is its 404."""
    async with started(root, operators) as live, httpx.AsyncClient(base_url=live.url) as http:
        await sign_in(http, "rita")
        bad_sessions = (
            "S" * 5000,
            live.session_id + "0",
            live.session_id.upper(),
            "SES-nope",
            "%2E%2E",
            "SES-%00",
            live.session_id.replace("-", "%0A", 1),
        )
        for bad in bad_sessions:
            answer = await http.get(f"/sessions/{bad}")
            refused_page(answer, 404, "not found")
            assert "a session id looks like" in answer.text, bad
            stream = await http.get(f"/events?session={bad}")
            assert stream.status_code == 400, bad
            assert stream.text.startswith("session: no session")
        unknown = live.session_id[:-16] + "0" * 16
        answer = await http.get(f"/sessions/{unknown}")
        refused_page(answer, 404, "not found")
        assert "a session id looks like" not in answer.text
        assert (await http.get(f"/sessions/{live.session_id}")).status_code == 200
        for bad in ("x" * 5000, "-x", "a b", "é"):
            answer = await http.get("/executors", params={"after": bad})
            refused_page(answer, 400, "bad request")
            assert "is not an executor id" in answer.text
        assert (await http.get("/executors", params={"after": "echo"})).status_code == 200
