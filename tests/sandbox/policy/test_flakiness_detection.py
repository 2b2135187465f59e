"""Seed 003 section 1: transient vs persistent failures, entropy detection, backoff."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from sandbox.policy.attempts import AgentPhase, RetryOptions
from sandbox.policy.classifier import (
    EXIT_COMPILATION_ERROR,
    EXIT_NETWORK_TIMEOUT,
    ErrorClass,
    ErrorClassifier,
)
from sandbox.policy.retry_protocol import (
    CountingEntropyDetector,
    EntropyStatistics,
    SandboxRetryExhaustedError,
    SandboxRetryProtocol,
    ToolCall,
    ToolResult,
    call_fingerprint,
)

P = AgentPhase
OK = ToolResult(exit_code=0)
TIMEOUT = ToolResult(exit_code=EXIT_NETWORK_TIMEOUT)
COMPILE = ToolResult(exit_code=EXIT_COMPILATION_ERROR)
CALL = ToolCall(id="call-7", name="build", arguments={"target": "all", "jobs": 2})


class ScriptedExecutor:
    """Returns scripted results in order."""

    def __init__(self, results: Sequence[ToolResult]) -> None:
        self.results = list(results)
        self.count = 0

    async def execute(self, tool_call: ToolCall) -> ToolResult:
        self.count += 1
        return self.results.pop(0)


class SpyDetector:
    """Counts notifications and snapshots them when each backoff starts."""

    def __init__(self) -> None:
        self.notified: list[tuple[str, AgentPhase]] = []

    def record(self, tool_call: ToolCall, phase: AgentPhase) -> bool:
        self.notified.append((tool_call.id, phase))
        return False


class DelayRecorder:
    """Injected delay: records the requested waits (seconds) without sleeping."""

    def __init__(self, detector: SpyDetector | None = None) -> None:
        self.waits: list[float] = []
        self.detector = detector
        self.notified_during_waits: list[int] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.detector is not None:
            self.notified_during_waits.append(len(self.detector.notified))


def _setup(
    results: Sequence[ToolResult],
) -> tuple[SandboxRetryProtocol, ScriptedExecutor, SpyDetector, DelayRecorder]:
    executor, detector = ScriptedExecutor(results), SpyDetector()
    delay = DelayRecorder(detector)
    return SandboxRetryProtocol(executor, detector, delay=delay), executor, detector, delay


async def test_network_timeout_is_transient_and_retried() -> None:
    """EXIT_NETWORK_TIMEOUT (124) is a TransientError and is retried."""
    assert ErrorClassifier.classify(EXIT_NETWORK_TIMEOUT) is ErrorClass.TRANSIENT
    protocol, executor, _, _ = _setup([TIMEOUT, OK])
    assert await protocol.execute_with_retry(CALL, P.GREEN) is OK
    assert executor.count == 2


async def test_compilation_error_is_persistent_and_does_not_trigger_entropy() -> None:
    """EXIT_COMPILATION_ERROR (1) is a PersistentError; failing alone does not trigger entropy."""
    assert ErrorClassifier.classify(EXIT_COMPILATION_ERROR) is ErrorClass.PERSISTENT
    protocol, executor, detector, delay = _setup([COMPILE, COMPILE, OK])
    assert await protocol.execute_with_retry(CALL, P.GREEN) is OK
    assert executor.count == 3
    assert detector.notified == []
    assert delay.notified_during_waits == [0, 0]


async def test_transient_retried_then_succeeding_does_not_notify_entropy() -> None:
    """A TransientError that is retried and eventually succeeds never notifies the detector."""
    protocol, _, detector, _ = _setup([TIMEOUT, TIMEOUT, OK])
    assert await protocol.execute_with_retry(CALL, P.VERIFY) is OK
    assert detector.notified == []


async def test_persistent_failing_all_retries_notifies_entropy() -> None:
    """A PersistentError that fails all retries notifies the detector exactly once, then raises."""
    protocol, _, detector, delay = _setup([COMPILE, COMPILE, COMPILE])
    with pytest.raises(SandboxRetryExhaustedError):
        await protocol.execute_with_retry(CALL, P.VERIFY)
    assert detector.notified == [("call-7", P.VERIFY)]
    assert delay.notified_during_waits == [0, 0]


async def test_backoff_is_500_then_1000_ms() -> None:
    """Exponential backoff from 500 ms: the injected delay sees 500 ms, then 1000 ms."""
    protocol, _, _, delay = _setup([COMPILE, COMPILE, COMPILE])
    with pytest.raises(SandboxRetryExhaustedError):
        await protocol.execute_with_retry(CALL, P.GREEN)
    assert [round(w * 1000) for w in delay.waits] == [500, 1000]


async def test_backoff_for_transient_faults_is_the_same_schedule() -> None:
    """Transient retries wait 500 then 1000 ms as well."""
    protocol, _, _, delay = _setup([TIMEOUT, TIMEOUT, OK])
    await protocol.execute_with_retry(CALL, P.GREEN)
    assert delay.waits == [0.5, 1.0]


async def test_delay_is_injected_never_defaulted() -> None:
    """The policy imports no event loop: the caller injects the delay (anyio.sleep here), and
    a protocol built without one is refused."""
    executor = ScriptedExecutor([COMPILE, OK])
    options = RetryOptions(base_delay_ms=0)
    with pytest.raises(TypeError, match=r"delay"):
        SandboxRetryProtocol(executor, SpyDetector(), options)  # type: ignore[call-arg]
    protocol = SandboxRetryProtocol(executor, SpyDetector(), options, delay=anyio.sleep)
    assert await protocol.execute_with_retry(CALL, P.GREEN) is OK


# ----------------------------------------------------------------- CountingEntropyDetector
def test_counting_detector_crosses_threshold_per_fingerprint() -> None:
    """The default detector counts per call fingerprint and reports True from the threshold on."""
    detector = CountingEntropyDetector(threshold=2)
    other = ToolCall(id="call-8", name="build", arguments={"target": "docs"})
    assert detector.record(CALL, P.GREEN) is False
    assert detector.record(other, P.GREEN) is False
    assert detector.record(CALL, P.VERIFY) is True
    assert detector.record(CALL, P.GREEN) is True
    assert detector.count(CALL) == 3
    assert detector.count(other) == 1
    assert detector.statistics() == EntropyStatistics(
        threshold=2, records=4, fingerprints=2, over_threshold=(call_fingerprint(CALL),)
    )


def test_fingerprint_ignores_id_and_argument_order() -> None:
    """The fingerprint is name + canonical sorted arguments: ids and key order do not matter."""
    first = ToolCall(id="a", name="build", arguments={"x": 1, "y": [1, {"b": 2, "a": 1}]})
    second = ToolCall(id="b", name="build", arguments={"y": [1, {"a": 1, "b": 2}], "x": 1})
    assert call_fingerprint(first) == call_fingerprint(second)
    assert call_fingerprint(first) == 'build:{"x":1,"y":[1,{"a":1,"b":2}]}'
    assert call_fingerprint(first) != call_fingerprint(ToolCall(id="a", name="test"))


def test_default_threshold_is_three() -> None:
    """CountingEntropyDetector() flags the third exhaustion of the same call."""
    detector = CountingEntropyDetector()
    assert [detector.record(CALL, P.GREEN) for _ in range(3)] == [False, False, True]


@pytest.mark.parametrize("threshold", [0, -1, True, 1.5])
def test_bad_threshold_is_rejected(threshold: object) -> None:
    """A threshold that is not an int >= 1 is a ValueError."""
    with pytest.raises(ValueError, match=r"^threshold must be an int >= 1, got "):
        CountingEntropyDetector(threshold=threshold)  # type: ignore[arg-type]
