# The executor SDK: write an executor as a class with one async handler per command type;
# the SDK connects to executors.sock, says hello, keeps heartbeats both ways, runs handlers with
# cancellation, answers every instruction exactly once and reconnects with backoff.
# Layering: imports supervisor.wire (frames, executor messages), supervisor.errors and the pure
# sandbox policy types, never the daemon's hub. Inside: client (run_executor: connect, reconnect)
# -> connection (one connection) -> inbox (frames in), messages (decode, answers), slots (the
# workers that run handlers); executor, errors, backoff and tracing beside them.
from supervisor.sdk.backoff import Backoff as Backoff
from supervisor.sdk.client import run_executor as run_executor
from supervisor.sdk.connection import Connection as Connection
from supervisor.sdk.errors import ExecutorRejected as ExecutorRejected
from supervisor.sdk.errors import WrongSocket as WrongSocket
from supervisor.sdk.executor import Executor as Executor
from supervisor.sdk.executor import Instruction as Instruction
from supervisor.sdk.executor import NotSupported as NotSupported
from supervisor.sdk.executor import Result as Result
from supervisor.sdk.executor import sha256_hex as sha256_hex

__all__ = [
    "Backoff",
    "Connection",
    "Executor",
    "ExecutorRejected",
    "Instruction",
    "NotSupported",
    "Result",
    "WrongSocket",
    "run_executor",
    "sha256_hex",
]
