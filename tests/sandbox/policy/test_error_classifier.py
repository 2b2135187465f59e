"""Seed 003 ErrorClassifier: transient (124-128, signals) vs persistent exit codes."""

from __future__ import annotations

import pytest

from sandbox.policy.classifier import (
    EXIT_COMPILATION_ERROR,
    EXIT_DOCKER_DAEMON_UNAVAILABLE,
    EXIT_NETWORK_TIMEOUT,
    TRANSIENT_EXIT_CODES,
    ErrorClass,
    ErrorClassifier,
)
from sandbox.policy.faults import ExecutionFaultType


def test_seed_constants() -> None:
    """The seed's constants have the seed's values."""
    assert (EXIT_NETWORK_TIMEOUT, EXIT_DOCKER_DAEMON_UNAVAILABLE, EXIT_COMPILATION_ERROR) == (
        124,
        125,
        1,
    )


def test_error_class_values_are_the_seed_names() -> None:
    """ErrorClass values are seed 003's 'TransientError' and 'PersistentError'."""
    assert ErrorClass.TRANSIENT.value == "TransientError"
    assert ErrorClass.PERSISTENT.value == "PersistentError"


@pytest.mark.parametrize("code", [124, 125, 126, 127, 128, -9, -15])
def test_transient_codes(code: int) -> None:
    """124-128 and negative (killed by a signal) codes are transient."""
    assert ErrorClassifier.classify(code) is ErrorClass.TRANSIENT


@pytest.mark.parametrize("code", [1, 2, 123, 129, 137, 255, 100_000])
def test_persistent_codes(code: int) -> None:
    """Every other non-zero code is persistent."""
    assert ErrorClassifier.classify(code) is ErrorClass.PERSISTENT


def test_transient_set_is_the_seed_range() -> None:
    """TRANSIENT_EXIT_CODES is exactly 124..128."""
    assert frozenset(range(124, 129)) == TRANSIENT_EXIT_CODES


def test_zero_is_not_an_error() -> None:
    """Classifying exit code 0 is a caller bug: ValueError."""
    with pytest.raises(ValueError, match=r"^exit code 0 is a success, not an error$"):
        ErrorClassifier.classify(0)


@pytest.mark.parametrize("code", ["1", 1.0, None, True])
def test_non_int_is_rejected(code: object) -> None:
    """A non-int exit code (also bool) is a TypeError."""
    with pytest.raises(TypeError, match=r"^exit code must be an int, got "):
        ErrorClassifier.classify(code)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "fault"),
    [
        (124, ExecutionFaultType.TIMEOUT),
        (125, ExecutionFaultType.CRASH),
        (126, ExecutionFaultType.CRASH),
        (128, ExecutionFaultType.CRASH),
        (-9, ExecutionFaultType.CRASH),
        (1, None),
        (2, None),
    ],
)
def test_fault_type_of_exit_code(code: int, fault: ExecutionFaultType | None) -> None:
    """A transient code stands for a fault: 124 TIMEOUT, 125-128 CRASH; persistent: None."""
    assert ErrorClassifier.fault_type(code) is fault


def test_classifier_is_stateless() -> None:
    """ErrorClassifier holds no state: no instance attributes can be set."""
    classifier = ErrorClassifier()
    with pytest.raises(AttributeError):
        classifier.memo = 1  # type: ignore[attr-defined]
    assert classifier.classify(1) is ErrorClassifier.classify(1)
