"""The fair order of waiting turns (`fairness`): weighted round robin across keys, FIFO within."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.turns.fairness import MAX_PRIORITY, FairQueue, Share, share_of

KEYS = st.sampled_from("abcde")


@dataclass(frozen=True)
class Push:
    key: str
    weight: int


@dataclass(frozen=True)
class Pop:
    pass


@dataclass(frozen=True)
class Remove:
    index: int  # which waiting item (modulo the number waiting)


OPS = st.lists(
    st.one_of(
        st.builds(Push, KEYS, st.sampled_from([1, 1, 1, 2, 3, MAX_PRIORITY])),
        st.builds(Push, KEYS, st.just(1)),
        st.just(Pop()),
        st.builds(Remove, st.integers(0, 10_000)),
    ),
    max_size=300,
)


def _drain(queue: FairQueue[str, tuple[str, int]]) -> list[tuple[str, int]]:
    out = []
    while (item := queue.pop()) is not None:
        out.append(item)
    return out


def test_round_robin_across_keys() -> None:
    """A flood of one key and a single item of another: the single one leaves second, not last."""
    queue: FairQueue[str, str] = FairQueue()
    for i in range(1000):
        queue.push("flood", i, f"flood-{i}")
    queue.push("quiet", 1000, "quiet-0")
    assert [queue.pop() for _ in range(3)] == ["flood-0", "quiet-0", "flood-1"]
    assert len(queue) == 998


def test_weights_give_starts_per_round() -> None:
    """A key of weight 3 gets three starts for each one of a key of weight 1."""
    queue: FairQueue[str, str] = FairQueue()
    for i in range(6):
        queue.push("heavy", i, "H", weight=3)
        queue.push("light", 100 + i, "L")
    assert "".join(str(queue.pop()) for _ in range(8)) == "HHHLHHHL"


def test_remove_and_empty_lane() -> None:
    """Removing a key's last item takes the key out of the ring; unknown ids give None."""
    queue: FairQueue[str, str] = FairQueue()
    queue.push("a", 1, "a1")
    queue.push("b", 2, "b1")
    assert queue.remove(1) == "a1"
    assert queue.remove(1) is None
    assert queue.keys() == 1
    assert queue.pop() == "b1"
    assert queue.pop() is None
    assert queue.keys() == 0


def test_an_id_is_queued_once() -> None:
    """Pushing an id that already waits is a bug the queue refuses."""
    queue: FairQueue[str, str] = FairQueue()
    queue.push("a", 1, "a1")
    with pytest.raises(ValueError, match=r"^item 1 is already queued$"):
        queue.push("b", 1, "b1")


def test_share_of_a_session() -> None:
    """No tenant: the session is its own key; priority is clamped to its bounds."""
    assert share_of("SES-1", tenant=None, priority=None) == Share("session:SES-1", 1)
    assert share_of("SES-1", tenant="acme", priority=3) == Share("tenant:acme", 3)
    assert share_of("SES-2", tenant="acme", priority=99).weight == MAX_PRIORITY
    assert share_of("SES-2", tenant="SES-1", priority=None).key != "session:SES-1"


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_fifo_within_a_key_and_nothing_lost(ops: list[Push | Pop | Remove]) -> None:
    """Whatever the pushes, pops and removes: every item leaves once (popped or removed), and a
    key's items leave in the order they came."""
    queue: FairQueue[str, tuple[str, int]] = FairQueue()
    waiting: dict[int, tuple[str, int]] = {}
    popped: list[tuple[str, int]] = []
    removed: list[int] = []
    next_id = 0
    for op in ops:
        if isinstance(op, Push):
            item = (op.key, next_id)
            queue.push(op.key, next_id, item, weight=op.weight)
            waiting[next_id] = item
            next_id += 1
        elif isinstance(op, Pop):
            got = queue.pop()
            assert (got is None) == (not waiting)
            if got is not None:
                popped.append(got)
                del waiting[got[1]]
        elif waiting:
            victim = sorted(waiting)[op.index % len(waiting)]
            assert queue.remove(victim) == waiting.pop(victim)
            removed.append(victim)
        assert len(queue) == len(waiting)
    popped.extend(_drain(queue))
    assert sorted([i for _, i in popped] + removed) == list(range(next_id))
    for key in "abcde":
        ids = [i for k, i in popped if k == key]
        assert ids == sorted(ids)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_no_waiting_key_is_skipped_more_than_a_round(ops: list[Push | Pop | Remove]) -> None:
    """While a key has items waiting, each other key has at most its weight of items leave
    before one of the waiting key's does: one round, so never more than
    (keys - 1) * MAX_PRIORITY in all."""
    queue: FairQueue[str, tuple[str, int]] = FairQueue()
    top: dict[str, int] = {}  # the highest weight each key has had
    waiting: dict[str, set[int]] = {k: set() for k in "abcde"}
    # for each waiting key, how many of each other key's items left since it last had a turn
    passed: dict[str, dict[str, int]] = {k: {} for k in "abcde"}
    next_id = 0
    for op in ops:
        if isinstance(op, Push):
            queue.push(op.key, next_id, (op.key, next_id), weight=op.weight)
            top[op.key] = max(top.get(op.key, 0), op.weight)
            if not waiting[op.key]:
                passed[op.key] = {}
            waiting[op.key].add(next_id)
            next_id += 1
        elif isinstance(op, Pop):
            got = queue.pop()
            if got is None:
                continue
            key, item_id = got
            waiting[key].discard(item_id)
            passed[key] = {}
            for other, ids in waiting.items():
                if other != key and ids:
                    passed[other][key] = passed[other].get(key, 0) + 1
                    assert passed[other][key] <= top[key]
                    assert sum(passed[other].values()) <= 4 * MAX_PRIORITY
        else:
            everything = sorted((i, k) for k, ids in waiting.items() for i in ids)
            if everything:
                item_id, key = everything[op.index % len(everything)]
                queue.remove(item_id)
                waiting[key].discard(item_id)
