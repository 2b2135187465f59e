"""`hunter` subcommands of the daemon core: serve, session, submit, status, executors, turn,
escalations, store, demo.

Every client command finds the daemon from ``--socket PATH`` (the control socket itself),
``--root DIR`` (the socket is ``<root>/run/control.sock``), ``$HUNTER_CONTROL_SOCKET``, else the
configuration `hunter serve` would read (``--config FILE`` or ``$HUNTER_CONFIG``, under the
``HUNTER_*`` variables: its ``control_socket``, by default ``<root>/run/control.sock``), the
first given (`supervisor.cli.client.locate`; docs/configuration.md).

Exit codes
----------
* 0 — done (with ``--wait``: the turn succeeded)
* 1 — the daemon refused the request (the message names the problem), or the turn failed
* 2 — usage error (bad flags), or a configuration that cannot be read when it is needed to find
  the daemon (the message names the key or the file)
* 3 — the turn timed out; 4 — capability/security violation or rejected; 5 — budget exhausted;
  6 — escalated (parked for an operator); 7 — terminated or cancelled
  (these match `hunter turn` of the sandbox runtime)
* 8 — `hunter turn wait --timeout S`: S passed before the turn settled (it goes on; stderr says
  its state and how to wait again)
* 10 — no daemon answers on the socket (it says which socket and how to start one)
* `hunter serve`: 0 after a drain, 1 forced by a second signal, 2 bad config or a store that
  cannot be opened (unreachable or unmigrated PostgreSQL), 3 root already served by another
  daemon. `hunter store migrate`: 0 done or already current, 2 the store cannot be reached.

Modules: `session_commands`, `turn_commands` (submit, turn), `escalation_commands`,
`event_commands` (events),
`daemon_commands` (serve, status, executors, check-ledgers, drain), `store_commands`
(migrate), `demo_commands`, `package_commands` (the root of `hunter package`); `turn_record`
formats `hunter turn show`; what they share: `client` (reaching the daemon), `output`
(printing, tables), `exit_codes`. This module registers them in `hunter --help` order and
re-exports their public names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Imported for what they register: `hunter ledger export` and `ledger verify --store`; the
# daemon's root and `--config` for `hunter package install|list`.
import supervisor.cli.ledger_commands
import supervisor.cli.package_commands  # noqa: F401
from supervisor.cli.client import DEFAULT_ROOT
from supervisor.cli.daemon_commands import (
    add_check_ledgers_parser,
    add_drain_parser,
    add_executors_parser,
    add_sandbox_helper_parser,
    add_serve_parser,
    add_status_parser,
    format_executors,
    format_status,
)
from supervisor.cli.demo_commands import add_demo_parser
from supervisor.cli.escalation_commands import add_escalations_parser
from supervisor.cli.event_commands import add_events_parser
from supervisor.cli.exit_codes import (
    EXIT_FAILED,
    EXIT_NO_DAEMON,
    EXIT_NOT_SETTLED,
    EXIT_OK,
    EXIT_USAGE,
    STATE_EXIT_CODES,
)
from supervisor.cli.output import table
from supervisor.cli.session_commands import add_session_parser
from supervisor.cli.store_commands import add_store_parser
from supervisor.cli.turn_commands import (
    add_submit_parser,
    add_turn_parser,
    describe_turn,
    submit_params,
    wait_with_progress,
)

if TYPE_CHECKING:
    from supervisor.cli.main import Subparsers

__all__ = [
    "DEFAULT_ROOT",
    "EXIT_FAILED",
    "EXIT_NOT_SETTLED",
    "EXIT_NO_DAEMON",
    "EXIT_OK",
    "EXIT_USAGE",
    "STATE_EXIT_CODES",
    "add_parser",
    "describe_turn",
    "format_executors",
    "format_status",
    "submit_params",
    "table",
    "wait_with_progress",
]


def add_parser(subparsers: Subparsers) -> None:
    """Register serve, sandbox-helper, session, submit, status, executors, turn, escalations,
    events, check-ledgers, drain, store, demo (in that order)."""
    add_serve_parser(subparsers)
    add_sandbox_helper_parser(subparsers)
    add_session_parser(subparsers)
    add_submit_parser(subparsers)
    add_status_parser(subparsers)
    add_executors_parser(subparsers)
    add_turn_parser(subparsers)
    add_escalations_parser(subparsers)
    add_events_parser(subparsers)
    add_check_ledgers_parser(subparsers)
    add_drain_parser(subparsers)
    add_store_parser(subparsers)
    add_demo_parser(subparsers)
