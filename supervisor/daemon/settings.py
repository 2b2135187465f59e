"""The settings of the daemon's parts read from its configuration: the retry policy and budget
(``[retry]``), the hub (``[executors]``), the sandbox runtime and what `status` says of it
(``[sandbox]``). Pure translations, apart so that a new setting touches only its section's
function here (the SIGHUP reload uses the same ones)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ledger import GroupSyncer
from sandbox.policy.attempts import RetryOptions
from sandbox.policy.breaker import BreakerLimits
from sandbox.policy.budget import RESOLUTION_MS, BudgetLimits
from supervisor.config import Config
from supervisor.executors.hub import HubSettings
from supervisor.turns.sessions import RuntimeLike

if TYPE_CHECKING:
    from sandbox.runtime.runtime import RuntimeConfig

__all__ = [
    "budget_limits",
    "default_process_slots",
    "hub_settings",
    "make_runtime",
    "retry_options",
    "runtime_config_of",
    "sandbox_summary",
]


def retry_options(config: Config) -> RetryOptions:
    """The `RetryOptions` of the ``[retry]`` section."""
    r = config.retry
    return RetryOptions(
        max_attempts=r.max_attempts,
        base_delay_ms=r.base_delay_ms,
        backoff_multiplier=r.backoff_multiplier,
        max_delay_ms=r.max_delay_ms,
        jitter=r.jitter,
    )


def budget_limits(config: Config) -> BudgetLimits:
    """The daemon-wide retry budget of the ``[retry]`` section (``budget_*``)."""
    r = config.retry
    window_ms = round(r.budget_window_s * 1000)
    return BudgetLimits(
        ratio=r.budget_ratio,
        window_ms=max(window_ms, RESOLUTION_MS) if r.budget_window_s > 0 else 0,
        min_retries=r.budget_min_retries,
    )


def hub_settings(config: Config) -> HubSettings:
    """The hub's settings of the ``[executors]`` section."""
    e = config.executors
    return HubSettings(
        allowed_uids=config.allowed_uids,
        max_frame_bytes=e.max_frame_bytes,
        heartbeat_interval_s=e.heartbeat_interval_s,
        heartbeat_misses=e.heartbeat_misses,
        queue_capacity=e.queue_capacity,
        queue_wait_s=e.queue_wait_s,
        quarantine_s=e.quarantine_s,
        cancel_grace_s=e.cancel_grace_s,
        hello_timeout_s=e.hello_timeout_s,
        breaker=BreakerLimits(
            faults=e.breaker_faults,
            window_ms=max(1, round(e.breaker_window_s * 1000)),
            cooldown_ms=max(1, round(e.breaker_cooldown_s * 1000)),
        ),
    )


def default_process_slots() -> int:
    """Process turns run at once by default: twice the CPUs, at least two."""
    return max(2, 2 * (os.cpu_count() or 1))


def runtime_config_of(config: Config) -> RuntimeConfig:
    """The sandbox runtime's settings from *config*'s ``[sandbox]`` section."""
    from sandbox.runtime.session import RuntimeConfig

    s = config.sandbox
    return RuntimeConfig(
        enforcement=s.enforcement,
        uid_range=(s.uid_range_start, s.uid_range_start + s.uid_range_size - 1),
        memory_mb=max(1, s.memory_max_bytes // (1024 * 1024)),
        pids=s.pids_max,
        timeout_s=s.default_timeout_ms / 1000,
        output_bytes=s.output_max_bytes,
        kernel_audit=s.kernel_audit,
    )


@runtime_checkable
class _Enforcing(Protocol):
    """A runtime that reports its enforcement (`sandbox.runtime.Runtime` does)."""

    levels: dict[str, str]
    missing: dict[str, str]


def sandbox_summary(runtime: object, config: Config) -> dict[str, object]:
    """What `status` says of the sandbox: the enforcement mode, each mechanism's level, what is
    missing (strict mode refuses process turns while anything is), and the helper's socket."""
    levels = dict(runtime.levels) if isinstance(runtime, _Enforcing) else {}
    missing = dict(runtime.missing) if isinstance(runtime, _Enforcing) else {}
    helper = config.sandbox.helper_socket
    return {
        "enforcement": config.sandbox.enforcement,
        "helper_socket": None if helper is None else str(helper),
        "levels": levels,
        "missing": missing,
    }


def make_runtime(
    config: Config, *, syncer: GroupSyncer, forbidden_sockets: tuple[Path, ...]
) -> RuntimeLike:
    """The sandbox runtime for *config* (its ``[sandbox]`` section)."""
    from sandbox.runtime import Runtime

    s = config.sandbox
    runtime_config = runtime_config_of(config)
    helper = None
    if s.helper_socket is not None:
        from sandbox.helper.remote import HelperClient

        helper = HelperClient(s.helper_socket)
    runtime: RuntimeLike = Runtime(
        config.root,
        config=runtime_config,
        syncer=syncer,
        forbidden_sockets=forbidden_sockets,
        helper=helper,
    )
    return runtime
