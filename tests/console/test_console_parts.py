"""The console's pure parts: sign-ins and their expiry, the sign-in limit's window, the live
feed's fan-out (a browser that does not read is dropped, the others are not held up) and its
figures, the shared status snapshot, the timeline of a turn and the chart, the ``Host`` names
it answers to, and the ids it checks before the daemon sees them."""

from __future__ import annotations

import anyio
import pytest

from supervisor.client import Attempt, Turn
from supervisor.console import ids
from supervisor.console.charts import throughput_svg
from supervisor.console.errors import BadId, ConsoleError
from supervisor.console.hosts import allowed_hosts, parse_host
from supervisor.console.live import BUCKET_S, LiveFeed
from supervisor.console.operators import Role
from supervisor.console.signins import SignInLimit, SignIns
from supervisor.console.snapshot import Snapshot
from supervisor.console.timeline import timeline
from supervisor.feed import Event


def _event(seq: int, kind: str, turn_id: int, at_s: float, state: str | None = None) -> Event:
    return Event(
        seq=seq,
        kind=kind,
        at_us=int(at_s * 1e6),
        cursor=f"e:{seq}",
        session_id="S",
        turn_id=turn_id,
        state=state,
    )


def test_a_sign_in_expires_when_idle_and_when_old() -> None:
    signins = SignIns(idle_s=10, absolute_s=30)
    token, signin = signins.begin("alice", Role.RESOLVER, now=0)
    assert signins.find(token, 5) is signin
    assert signins.find(token, 14) is signin  # each request restarts the idle clock
    assert signins.find(token, 25) is None  # idle for 11 s
    token, _ = signins.begin("alice", Role.RESOLVER, now=100)
    for t in range(105, 130, 5):
        assert signins.find(token, t) is not None
    assert signins.find(token, 131) is None  # older than 30 s, however busy
    assert signins.find("not-a-token", 0) is None
    assert signins.find("x" * 500, 0) is None


def test_sign_in_tokens_are_kept_as_digests() -> None:
    signins = SignIns()
    token, signin = signins.begin("rita", Role.READER, now=0)
    assert token not in repr(signins._by_digest)
    assert signin.csrf_ok(signin.csrf)
    assert not signin.csrf_ok(None)
    assert not signin.csrf_ok(signin.csrf + "x")
    signins.end(token)
    assert signins.find(token, 0) is None


def test_the_sign_in_limit_opens_again_as_the_window_moves() -> None:
    limit = SignInLimit(failures=3, window_s=60)
    keys = ("address:1.2.3.4", "name:alice")
    for t in (0, 10, 20):
        assert limit.retry_after(keys, t) == 0
        limit.failed(keys, t)
    assert limit.retry_after(keys, 30) == pytest.approx(30)  # the first failure ages out at 60
    assert limit.retry_after(("name:alice",), 59) == pytest.approx(1)
    assert limit.retry_after(("name:bob",), 30) == 0  # another name, another address
    assert limit.retry_after(keys, 61) == 0


async def test_a_change_bumps_only_the_groups_it_concerns() -> None:
    """An event moves the generation of everything, of its turn and of its session, and of no
    other group; a group lives while a page follows it."""
    feed = LiveFeed()
    async with (
        feed.listen(turn=2) as two,
        feed.listen(turn=3) as three,
        feed.listen(session="S") as session,
        feed.listen(session="T") as other,
    ):
        for seq in range(1, 101):
            feed.publish(_event(seq, "turn.accepted", 2, 1.0))
        assert (two.generation, three.generation) == (100, 0)
        assert (session.generation, other.generation) == (100, 0)
        assert feed.everything.generation == 100
        assert (two.cursor, two.kind) == ("e:100", "turn.accepted")
        assert feed.streams == 4
        async with feed.listen(turn=2) as again:
            assert again is two  # pages of one turn share its group
    assert feed.streams == 0
    async with feed.listen(turn=2) as fresh:
        assert fresh.generation == 0  # the group went with its last page


async def test_a_waiting_stream_wakes_on_a_change_and_a_resync_reaches_all() -> None:
    feed = LiveFeed()
    async with feed.listen(turn=7) as follow:
        woke = anyio.Event()

        async def wait() -> None:
            await follow.wait_past(0)
            woke.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.01)
            feed.publish(_event(1, "turn.accepted", 8, 1.0))  # another turn: still waiting
            await anyio.sleep(0.01)
            assert not woke.is_set()
            feed.publish(Event(seq=0, kind="console.resync", at_us=0, cursor="", detail="lost"))
            with anyio.fail_after(1):
                await woke.wait()
        assert follow.kind == "console.resync"


def test_the_feed_counts_endings_and_their_latency_per_bucket() -> None:
    feed = LiveFeed()
    start = 1_000_000.0 - 1_000_000.0 % BUCKET_S
    for n in range(10):
        feed.publish(_event(2 * n + 1, "turn.accepted", n, start + 0.1))
        feed.publish(_event(2 * n + 2, "turn.ended", n, start + 0.1 + (n + 1) / 1000, "succeeded"))
    buckets = feed.buckets(start + 1)
    last = buckets[-1]
    assert (last.start_s, last.ended) == (start, 10)
    assert last.percentile(0.5) == pytest.approx(6.0)  # ms: 1..10, the upper median
    assert all(b.ended == 0 for b in buckets[:-1])
    assert [e.turn_id for e in feed.recent][:3] == [9, 8, 7]
    svg = throughput_svg(buckets)
    assert svg.startswith("<svg")
    assert "2 turns/s" in svg  # 10 endings in a 5 s bucket
    assert "<script" not in svg


async def test_the_status_snapshot_is_shared_for_a_second() -> None:
    snapshot: Snapshot[int] = Snapshot(max_age_s=1.0)
    calls = 0

    async def fetch() -> int:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.05)
        return calls

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(snapshot.get, fetch)
    assert calls == 1
    assert await snapshot.get(fetch) == 1


def test_the_timeline_shows_waits_decisions_and_backoffs() -> None:
    turn = Turn(
        turn_id=7,
        session_id="S",
        turn_number=3,
        state="succeeded",
        kind="instruction",
        accepted_us=1,
        finished_us=9,
        reason_code="ATTEMPT_SUCCEEDED",
        attempts=(
            Attempt(
                attempt=1,
                executor_id="ex",
                started_us=2,
                finished_us=3,
                outcome="FAULT",
                fault_type="CRASH",
                decision="RETRY",
                reason_code="RETRY_AFTER_CRASH",
                delay_ms=200,
                duration_ms=5,
                extra={"queued_ms": 30},
            ),
            Attempt(
                attempt=2,
                executor_id="ex",
                started_us=5,
                finished_us=8,
                outcome="SUCCESS",
                decision="SUCCEED",
                reason_code="ATTEMPT_SUCCEEDED",
            ),
        ),
    )
    steps = timeline(turn)
    assert [s.kind for s in steps] == [
        "accepted",
        "queued",
        "attempt",
        "decision",
        "backoff",
        "attempt",
        "decision",
        "ended",
    ]
    assert steps[1].ms == 30
    assert (steps[2].code, steps[2].tone) == ("CRASH", "bad")
    assert steps[3].code == "RETRY_AFTER_CRASH"
    assert steps[4].ms == 200
    assert (steps[-1].title, steps[-1].tone) == ("succeeded", "ok")
    escalated = Turn(
        turn_id=8,
        session_id="S",
        turn_number=4,
        state="escalated",
        reason_code="RESOURCE_EXHAUSTED_ESCALATE",
    )
    assert timeline(escalated)[-1].title == "escalated: waiting for an operator"


def test_host_headers_parse_as_name_and_port() -> None:
    assert parse_host("Console.Example:8470") == ("console.example", 8470)
    assert parse_host("localhost") == ("localhost", None)
    assert parse_host("[::1]:80") == ("::1", 80)
    assert parse_host("[::1]") == ("::1", None)
    for bad in (
        "",
        ":80",
        "::1",
        "[::1",
        "[::1]x",
        "[nope]:1",
        "a b",
        "a:",
        "a:0",
        "a:65536",
        "a:1:2",
        "a:+1",
        "a:\u0661",  # an Arabic-Indic digit one
        "évil.example",
        "a_b",
        "localhost.",
    ):
        assert parse_host(bad) is None, bad


def test_a_loopback_console_answers_its_address_and_localhost_names_only() -> None:
    hosts = allowed_hosts(listening=["127.0.0.1", "127.0.0.1"], port=8470)
    for ok in ("127.0.0.1:8470", "localhost:8470", "[::1]:8470", "LocalHost:8470"):
        assert hosts.permits(ok), ok
    for bad in (
        None,
        "127.0.0.1",
        "localhost",
        "127.0.0.1:8471",
        "evil.example:8470",
        "[::2]:8470",
    ):
        assert not hosts.permits(bad), bad


def test_the_schemes_own_port_may_be_left_out() -> None:
    plain = allowed_hosts(listening=["10.0.0.5"], port=80)
    assert plain.permits("10.0.0.5")
    assert plain.permits("10.0.0.5:80")
    assert not plain.permits("localhost")  # not loopback: its names are not ours
    tls = allowed_hosts(listening=["10.0.0.5"], port=443, tls=True)
    assert tls.permits("10.0.0.5")
    assert not allowed_hosts(listening=["10.0.0.5"], port=443).permits("10.0.0.5")


def test_every_address_means_loopback_names_and_the_given_ones() -> None:
    hosts = allowed_hosts(
        listening=["0.0.0.0"], port=8470, extra=["console.example", "b.example:1"]
    )
    assert hosts.permits("localhost:8470")
    assert hosts.permits("console.example:8470")
    assert hosts.permits("console.example")
    assert hosts.permits("b.example:1")
    assert not hosts.permits("b.example:8470")
    assert not hosts.permits("0.0.0.0:8470")
    assert not hosts.permits("evil.example:8470")


def test_a_unix_socket_answers_the_given_names_or_any() -> None:
    assert allowed_hosts().permits("anything.example")
    assert allowed_hosts().permits(None)
    named = allowed_hosts(extra=["console.example"])
    assert named.permits("console.example")
    assert not named.permits("localhost")
    assert not named.permits(None)


def test_a_bad_allowed_host_is_named() -> None:
    with pytest.raises(ConsoleError, match=r"^--allow-host 'http://x': give a host name"):
        allowed_hosts(extra=["http://x"])


def test_the_id_grammars_are_the_daemons() -> None:
    """The console restates the daemon's id grammars; they must agree."""
    from sandbox.session_ids import SESSION_ID_RE, new_session_id
    from supervisor.wire.control import MAX_TURN_ID

    assert ids.MAX_TURN_ID == MAX_TURN_ID
    assert ids._SESSION_ID.pattern == SESSION_ID_RE.pattern.strip("^$")
    fresh = new_session_id()
    assert ids.session_id(fresh) == fresh


def test_turn_ids_and_cursors() -> None:
    assert ids.turn_id("1") == 1
    assert ids.turn_id(str(ids.MAX_TURN_ID)) == ids.MAX_TURN_ID
    assert ids.turn_id("007") == 7
    for bad in ("0", str(ids.MAX_TURN_ID + 1), "9" * 5000, "-1", "+1", " 1", "²", "1e3", ""):
        with pytest.raises(BadId, match=r"^no turn ") as caught:
            ids.turn_id(bad)
        assert caught.value.status == 404
    with pytest.raises(BadId, match=r"^no turn '9{40}…'") as long:
        ids.turn_id("9" * 5000, in_path=False)
    assert long.value.status == 400
    assert ids.after_turn(None) == 0
    assert ids.after_turn("") == 0
    assert ids.after_turn("0") == 0
    with pytest.raises(BadId, match=r"^after: '-1' is not a turn id") as after:
        ids.after_turn("-1")
    assert after.value.status == 400
    assert ids.after_executor("echo-1.a@b:c") == "echo-1.a@b:c"
    assert ids.after_executor(None) == ""
    for bad in ("x" * 129, "-x", "a b", "é"):
        with pytest.raises(BadId, match=r"is not an executor id"):
            ids.after_executor(bad)
