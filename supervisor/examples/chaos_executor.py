"""A chaos executor: misbehaves on purpose, in configurable ways, to exercise the daemon.

Run: ``python -m supervisor.examples.chaos_executor --socket PATH --id chaos-1
--behaviour 'READ=crash,ok' --behaviour 'hang'``

A behaviour spec is ``[COMMAND=]b1,b2,...``: the executor applies b1 to the first instruction
(of that command, or of any command without a more specific spec), b2 to the second, and so on;
the last one repeats. ``error,error,ok`` therefore fails twice, then succeeds (retry tests).
``--probability P`` applies the spec only with probability P (seeded by ``--seed``), otherwise
``ok``. Specs may also come from ``HUNTER_CHAOS`` (``;``-separated). ``--state-file`` keeps the
per-command counters in a file so a restarted process (after ``crash``) continues the sequence.

Behaviours:
  ok                 SUCCESS with a real evidence hash (sha256 of ``chaos:<instruction id>``)
  crash              exit(70) mid-instruction, without answering
  hang               never answer, but honour ``cancel`` (the SDK answers TIMEOUT)
  hang-ignore-cancel never answer, ignore ``cancel`` (the daemon marks the executor ERROR)
  slow               answer SUCCESS after ``--delay-ms``, ignoring ``cancel`` (late response)
  garbage            send a frame whose body is not JSON, then hang
  oversized          send a frame header announcing more than the daemon's limit, then hang
  truncated          send half a frame and exit(71)
  wrong-id           SUCCESS for another instruction id
  missing-id         a response without instruction_id
  no-evidence        SUCCESS without evidence_hash
  unknown-type       response_type "MAYBE"
  malformed          a response that is not a JSON object
  partial            SUCCESS with partial=true
  authority          SUCCESS that also tries to set the retry decision and grant capabilities
  failure            FAILURE (the action did not work)
  error              ERROR (executor error: CRASH for the daemon)
  refuse             REFUSED
  not-json-frame     alias of garbage
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import orjson

from sandbox.policy.envelopes import ExecutorCommandType
from supervisor.examples._cli import configure_example_logging, run_until_signal
from supervisor.sdk import Executor, Instruction, Result, run_executor

__all__ = ["BEHAVIOURS", "ChaosExecutor", "ChaosPlan", "main", "parse_behaviour_spec"]

BEHAVIOURS: Final = frozenset(
    {
        "ok",
        "crash",
        "hang",
        "hang-ignore-cancel",
        "slow",
        "garbage",
        "not-json-frame",
        "oversized",
        "truncated",
        "wrong-id",
        "missing-id",
        "no-evidence",
        "unknown-type",
        "malformed",
        "partial",
        "authority",
        "failure",
        "error",
        "refuse",
    }
)
_ANY: Final = "*"
_WORK: Final = (
    ExecutorCommandType.NAVIGATE,
    ExecutorCommandType.CLICK,
    ExecutorCommandType.READ,
    ExecutorCommandType.SCROLL,
    ExecutorCommandType.SCREENSHOT,
    ExecutorCommandType.EXTRACT,
)


def parse_behaviour_spec(spec: str) -> tuple[str, tuple[str, ...]]:
    """``'READ=crash,ok'`` → ``('READ', ('crash', 'ok'))``; ``'hang'`` → ``('*', ('hang',))``."""
    command, sep, rest = spec.partition("=")
    if not sep:
        command, rest = _ANY, spec
    command = command.strip().upper() if command != _ANY else _ANY
    if command != _ANY and command not in ExecutorCommandType.__members__:
        raise ValueError(f"unknown command type {command!r} in behaviour spec {spec!r}")
    steps = tuple(s.strip().lower() for s in rest.split(",") if s.strip())
    if not steps:
        raise ValueError(f"behaviour spec {spec!r} names no behaviour")
    unknown = [s for s in steps if s not in BEHAVIOURS]
    if unknown:
        raise ValueError(f"unknown behaviour(s) {', '.join(unknown)} in {spec!r}")
    return command, steps


@dataclass(frozen=True, slots=True)
class ChaosPlan:
    """Which behaviour to apply to the n-th instruction of each command."""

    sequences: Mapping[str, tuple[str, ...]]
    probability: float = 1.0
    delay_ms: int = 1000

    def behaviour(self, command: ExecutorCommandType, index: int, rand: float) -> str:
        steps = self.sequences.get(command.value) or self.sequences.get(_ANY) or ("ok",)
        step = steps[min(index, len(steps) - 1)]
        if step != "ok" and rand >= self.probability:
            return "ok"
        return step


class ChaosExecutor(Executor):
    """An SDK executor whose every handler follows a ``ChaosPlan``."""

    software = "hunter-chaos-executor/1"

    def __init__(
        self,
        *,
        executor_id: str,
        plan: ChaosPlan,
        slots: int = 1,
        commands: Sequence[ExecutorCommandType] = _WORK,
        seed: int | None = None,
        state_file: Path | None = None,
    ) -> None:
        super().__init__(executor_id=executor_id, slots=slots)
        self.plan = plan
        self._commands = tuple(commands)
        self._random = random.Random(seed)
        self._state_file = state_file
        self._counts: dict[str, int] = self._load_counts()

    def commands(self) -> tuple[ExecutorCommandType, ...]:
        return self._commands

    def _load_counts(self) -> dict[str, int]:
        if self._state_file is None or not self._state_file.exists():
            return {}
        data = orjson.loads(self._state_file.read_bytes())
        return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _next_index(self, command: ExecutorCommandType) -> int:
        key = command.value if command.value in self.plan.sequences else _ANY
        index = self._counts.get(key, 0)
        self._counts[key] = index + 1
        if self._state_file is not None:
            tmp = self._state_file.with_suffix(".tmp")
            tmp.write_bytes(orjson.dumps(self._counts))
            tmp.replace(self._state_file)
        return index

    async def handle(self, instruction: Instruction) -> Result | Mapping[str, Any]:
        index = self._next_index(instruction.command_type)
        behaviour = self.plan.behaviour(instruction.command_type, index, self._random.random())
        return await self._act(behaviour, instruction)

    async def _act(self, behaviour: str, instruction: Instruction) -> Result | Mapping[str, Any]:
        iid = instruction.instruction_id
        evidence = f"chaos:{iid}"
        ok = Result.success(evidence, output={"behaviour": behaviour})
        if behaviour == "ok":
            return ok
        if behaviour == "crash":
            sys.stderr.flush()
            os._exit(70)
        if behaviour == "hang":
            await anyio.sleep_forever()
        if behaviour == "hang-ignore-cancel":
            with anyio.CancelScope(shield=True):
                await anyio.sleep_forever()
        if behaviour == "slow":
            with anyio.CancelScope(shield=True):
                await anyio.sleep(self.plan.delay_ms / 1000)
            return ok
        if behaviour in {"garbage", "not-json-frame", "oversized", "truncated"}:
            await self._send_broken(behaviour)
            await anyio.sleep_forever()
        wire = ok.to_wire(iid)
        if behaviour == "wrong-id":
            return {**wire, "instruction_id": f"{iid}-not-me"}
        if behaviour == "missing-id":
            return {k: v for k, v in wire.items() if k != "instruction_id"}
        if behaviour == "no-evidence":
            return {**wire, "evidence_hash": ""}
        if behaviour == "unknown-type":
            return {**wire, "response_type": "MAYBE"}
        if behaviour == "malformed":
            return {"response": "this is not a response envelope"}
        if behaviour == "partial":
            return Result.success(evidence, output={"behaviour": behaviour}, partial=True)
        if behaviour == "authority":
            return {
                **wire,
                "decision": "RETRY",
                "output": {"capabilities": ["write:/"], "max_retries": 99},
            }
        if behaviour == "failure":
            return Result.failure(f"chaos failure of {iid}")
        if behaviour == "error":
            return Result.error(f"chaos error in {iid}")
        if behaviour == "refuse":
            return Result.refused(f"chaos refuses {iid}")
        raise AssertionError(f"unhandled behaviour {behaviour}")  # parse_behaviour_spec guards

    async def _send_broken(self, behaviour: str) -> None:
        connection = self.connection
        if connection is None:  # pragma: no cover - handlers run only while connected
            return
        if behaviour == "oversized":
            limit = connection.welcome.max_frame_bytes if connection.welcome else 1_048_576
            await connection.send_raw(struct.pack(">I", limit + 1) + b"{" + b" " * 1024)
        elif behaviour == "truncated":
            await connection.send_raw(struct.pack(">I", 100) + b'{"type": "resp')
            await connection.flush()
            sys.stderr.flush()
            os._exit(71)
        else:
            body = b"\xff\xfe this is not JSON"
            await connection.send_raw(struct.pack(">I", len(body)) + body)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m supervisor.examples.chaos_executor",
        description="An executor that misbehaves on purpose (see the module docstring).",
    )
    parser.add_argument("--socket", required=True, help="the daemon's executors.sock")
    parser.add_argument("--id", dest="executor_id", required=True, help="executor id")
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument(
        "--behaviour",
        action="append",
        default=[],
        metavar="SPEC",
        help="[COMMAND=]b1,b2,... (repeatable); see the module docstring",
    )
    parser.add_argument(
        "--commands",
        default=",".join(c.value for c in _WORK),
        help="comma-separated command types to advertise",
    )
    parser.add_argument("--probability", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--delay-ms", type=int, default=1000, help="delay of 'slow'")
    parser.add_argument("--state-file", type=Path, default=None)
    parser.add_argument("--no-reconnect", action="store_true")
    parser.add_argument("--log-level", default="warning")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    specs = list(args.behaviour)
    env_specs = os.environ.get("HUNTER_CHAOS", "")
    specs.extend(s for s in env_specs.split(";") if s.strip())
    try:
        sequences = dict(parse_behaviour_spec(s) for s in specs)
        commands = [ExecutorCommandType(c.strip().upper()) for c in args.commands.split(",")]
    except ValueError as exc:
        sys.stderr.write(f"chaos_executor: {exc}\n")
        return 2
    configure_example_logging(args.log_level)
    executor = ChaosExecutor(
        executor_id=args.executor_id,
        plan=ChaosPlan(sequences, probability=args.probability, delay_ms=args.delay_ms),
        slots=args.slots,
        commands=commands,
        seed=args.seed,
        state_file=args.state_file,
    )
    return run_until_signal(
        lambda: run_executor(executor, socket_path=args.socket, reconnect=not args.no_reconnect)
    )


if __name__ == "__main__":
    raise SystemExit(main())
