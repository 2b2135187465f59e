"""`hunter mcp`'s cost: a tool call that runs ``/bin/true`` beside the same process turn through
the client library, same run (issue 29's target: at most 2 ms more).

One daemon (``harness.running_daemon``: a separate process, embedded store). The baseline is
``Client.submit_process(sid, ["/bin/true"], wait_s=..., compact=True)``: one round trip that
answers once the turn settled. The MCP side is the SDK's own client calling ``run_command``
on a `hunter mcp` subprocess over stdio, as an agent host does: the server submits the turn
(with ``requested_by``), follows it with ``turn.wait`` answering ``"record"`` (the settled
turn with its ledger entries: the hashes the answer carries), then answers with the structured
result.
The two alternate, call by call, in one session each; the script prints each side's p50, p90
and mean, and the difference.

    .venv/bin/python benchmarks/bench_mcp.py [--calls 200] [--warmup 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # ``benchmarks.*`` below, run as a script

from mcp.client import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp_types import Implementation  # noqa: E402

from benchmarks.harness import percentile, running_daemon  # noqa: E402
from supervisor.client import Client as HunterClient  # noqa: E402

TARGET_MS = 2.0


async def main(calls: int, warmup: int) -> int:
    async with running_daemon(session=False, prefix="hh-bench-mcp-") as daemon:
        socket = daemon.control_socket
        server = StdioServerParameters(
            command=sys.executable,
            args=["-m", "supervisor", "mcp", "--socket", str(socket), "--log-format", "json"],
            cwd=str(HERE.parent),
        )
        info = Implementation(name="bench-mcp", version="1")
        async with HunterClient(socket) as hunter, Client(server, client_info=info) as mcp:
            direct_sid = (await hunter.open_session("demo")).session_id
            opened = await mcp.call_tool("open_session", {"package_id": "demo"})
            mcp_sid = (opened.structured_content or {})["session_id"]
            direct: list[float] = []
            via_mcp: list[float] = []
            for n in range(warmup + calls):
                started = time.perf_counter()
                handle = await hunter.submit_process(
                    direct_sid, ["/bin/true"], wait_s=30, compact=True
                )
                took = time.perf_counter() - started
                assert handle.turn.state == "succeeded", handle.turn
                if n >= warmup:
                    direct.append(took * 1000)
                started = time.perf_counter()
                result = await mcp.call_tool(
                    "run_command", {"session_id": mcp_sid, "argv": ["/bin/true"]}
                )
                took = time.perf_counter() - started
                assert not result.is_error, result.content
                assert result.structured_content, result.content
                assert result.structured_content["state"] == "succeeded"
                if n >= warmup:
                    via_mcp.append(took * 1000)
    rows = [("client library", direct), ("MCP tool call", via_mcp)]
    print(f"process turn of /bin/true, {calls} calls each, alternating (ms)")
    print(f"{'':16} {'p50':>8} {'p90':>8} {'mean':>8}")
    for name, samples in rows:
        print(
            f"{name:16} {percentile(samples, 0.5):8.2f} {percentile(samples, 0.9):8.2f}"
            f" {statistics.fmean(samples):8.2f}"
        )
    p50 = percentile(via_mcp, 0.5) - percentile(direct, 0.5)
    mean = statistics.fmean(via_mcp) - statistics.fmean(direct)
    print(f"MCP costs more: p50 {p50:+.2f} ms, mean {mean:+.2f} ms (target <= {TARGET_MS} ms)")
    print("target met" if p50 <= TARGET_MS else "target MISSED")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    sys.exit(anyio.run(main, args.calls, args.warmup))
