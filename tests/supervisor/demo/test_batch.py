"""The demo batch: what is submitted and what it must end in."""

from __future__ import annotations

from supervisor.demo.batch import (
    CHAOS_ROUND,
    CHAOS_ROUND_2,
    chaos_batch,
    chaos_batch_2,
    process_batch,
    web_batch,
)


def test_labels_are_unique() -> None:
    """Each turn's idempotency key is made from its label, so no two labels may be equal."""
    labels = [
        e.label
        for e in (
            *web_batch("http://127.0.0.1:1"),
            *process_batch(),
            *chaos_batch(),
            *chaos_batch_2(),
        )
    ]
    assert len(labels) == len(set(labels))


def test_chaos_batches_only_use_commands_their_executors_advertise() -> None:
    """Every chaos turn's command type is advertised by an executor of its round."""
    for batch, executors in ((chaos_batch(), CHAOS_ROUND), (chaos_batch_2(), CHAOS_ROUND_2)):
        advertised = {command for _, command, _ in executors}
        assert {e.params["command_type"] for e in batch} <= advertised
