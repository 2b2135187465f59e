"""A test executor (a real process, the Python SDK) that asks for a wait before the retry.

``python -m tests.supervisor.retry_after_executor --socket PATH --id ID --command READ
--answer error --retry-after-ms 1500 --failures 1``: the first *failures* instructions are
answered FAILURE or ERROR with ``retry_after_ms``, every later one SUCCESS.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from sandbox.policy.envelopes import ExecutorCommandType
from supervisor.examples._cli import configure_example_logging, run_until_signal
from supervisor.sdk import Executor, Instruction, Result, run_executor


class RetryAfterExecutor(Executor):
    """Fails *failures* times asking for *retry_after_ms*, then succeeds."""

    def __init__(
        self,
        *,
        executor_id: str,
        command: ExecutorCommandType,
        answer: str,
        retry_after_ms: int,
        failures: int,
    ) -> None:
        super().__init__(executor_id=executor_id)
        self._command = command
        self._answer = answer
        self._retry_after_ms = retry_after_ms
        self._failures = failures

    def commands(self) -> tuple[ExecutorCommandType, ...]:
        return (self._command,)

    async def handle(self, instruction: Instruction) -> Result:
        if self._failures > 0:
            self._failures -= 1
            message = f"busy, try again in {self._retry_after_ms} ms"
            if self._answer == "failure":
                return Result.failure(message, retry_after_ms=self._retry_after_ms)
            return Result.error(message, retry_after_ms=self._retry_after_ms)
        return Result.success(f"ok:{instruction.instruction_id}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.supervisor.retry_after_executor")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--id", dest="executor_id", required=True)
    parser.add_argument("--command", default="READ")
    parser.add_argument("--answer", choices=("failure", "error"), default="error")
    parser.add_argument("--retry-after-ms", type=int, default=1000)
    parser.add_argument("--failures", type=int, default=1)
    args = parser.parse_args(argv)
    configure_example_logging("warning")
    executor = RetryAfterExecutor(
        executor_id=args.executor_id,
        command=ExecutorCommandType(args.command),
        answer=args.answer,
        retry_after_ms=args.retry_after_ms,
        failures=args.failures,
    )
    return run_until_signal(
        lambda: run_executor(executor, socket_path=args.socket, reconnect=False)
    )


if __name__ == "__main__":
    raise SystemExit(main())
