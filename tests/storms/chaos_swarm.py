"""Many chaos executors in one process: the crowd of the executor chaos suite.

Run: ``python -m tests.storms.chaos_swarm --socket PATH --id swarm-1
--executors 'garbage-3=garbage,flap-4=flap' --probability 0.5 --seed 7``

Each ``ID=BEHAVIOUR`` is one executor connection (its own `ChaosExecutor`, advertising READ
only) that applies its behaviour to an instruction with probability ``--probability`` and
answers ``ok`` otherwise (`supervisor.examples.chaos_executor` lists the behaviours). One
more behaviour lives here, ``flap``: an ``ok`` executor whose connection is dropped after a
random 0.2-2 s, then reconnects at once, again and again (a reconnect storm; an instruction
in flight when it drops is a CRASH for the daemon). ``crash`` and ``truncated`` end the whole
process: run those as separate processes (``chaos_executor``). ``--id`` names the process
in its log only. Hosting a hundred connections in a few processes keeps a hundred-plus
misbehaving executors affordable on a 2-core machine.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from typing import Final

import anyio

from sandbox.policy.envelopes import ExecutorCommandType
from supervisor.examples._cli import configure_example_logging, run_until_signal
from supervisor.examples.chaos_executor import BEHAVIOURS, ChaosExecutor, ChaosPlan
from supervisor.sdk import ExecutorRejected, run_executor

__all__ = ["PROCESS_ENDING", "SWARM_BEHAVIOURS", "main", "parse_executors"]

#: Behaviours that end the process (never hosted in a swarm).
PROCESS_ENDING: Final = frozenset({"crash", "truncated"})
#: What a swarm executor may do.
SWARM_BEHAVIOURS: Final = (BEHAVIOURS - PROCESS_ENDING) | {"flap"}


def parse_executors(spec: str) -> list[tuple[str, str]]:
    """``'a=hang,b=flap'`` → ``[('a', 'hang'), ('b', 'flap')]``."""
    pairs: list[tuple[str, str]] = []
    for item in spec.split(","):
        executor_id, sep, behaviour = item.strip().partition("=")
        if not sep or not executor_id or behaviour not in SWARM_BEHAVIOURS:
            msg = (
                f"bad swarm executor {item!r}: want ID=BEHAVIOUR, one of {sorted(SWARM_BEHAVIOURS)}"
            )
            raise ValueError(msg)
        pairs.append((executor_id, behaviour))
    return pairs


async def _serve(executor: ChaosExecutor, socket: str, flap: random.Random | None) -> None:
    try:
        if flap is None:
            await run_executor(executor, socket_path=socket)
            return
        while True:
            with anyio.move_on_after(flap.uniform(0.2, 2.0)):
                await run_executor(executor, socket_path=socket)
    except ExecutorRejected as exc:
        sys.stderr.write(f"{executor.executor_id} rejected for good: {exc}\n")


async def run_swarm(
    pairs: Sequence[tuple[str, str]],
    *,
    socket: str,
    probability: float,
    delay_ms: int,
    seed: int,
    slots: int,
) -> None:
    """Serve every executor of *pairs* until cancelled."""
    async with anyio.create_task_group() as tg:
        for index, (executor_id, behaviour) in enumerate(pairs):
            plan = ChaosPlan(
                {"*": ("ok" if behaviour == "flap" else behaviour,)},
                probability=probability,
                delay_ms=delay_ms,
            )
            executor = ChaosExecutor(
                executor_id=executor_id,
                plan=plan,
                slots=slots,
                commands=(ExecutorCommandType.READ,),
                seed=seed * 10_000 + index,
            )
            flap = random.Random(seed * 10_000 + index) if behaviour == "flap" else None
            tg.start_soon(_serve, executor, socket, flap)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.storms.chaos_swarm",
        description="Many chaos executors in one process (see the module docstring).",
    )
    parser.add_argument("--socket", required=True, help="the daemon's executors.sock")
    parser.add_argument("--id", dest="swarm_id", required=True, help="name of this process")
    parser.add_argument("--executors", required=True, metavar="ID=BEHAVIOUR,...")
    parser.add_argument("--probability", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delay-ms", type=int, default=1000, help="delay of 'slow'")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--log-level", default="error")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        pairs = parse_executors(args.executors)
    except ValueError as exc:
        sys.stderr.write(f"chaos_swarm: {exc}\n")
        return 2
    configure_example_logging(args.log_level)
    return run_until_signal(
        lambda: run_swarm(
            pairs,
            socket=args.socket,
            probability=args.probability,
            delay_ms=args.delay_ms,
            seed=args.seed,
            slots=args.slots,
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
