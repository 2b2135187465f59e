"""`hunter package install|list` (registered by `sandbox.cli`) find the root as the client
commands do: ``--root DIR``, else the root of the configuration `hunter serve` would read
(``--config FILE``, else ``$HUNTER_CONFIG``, under the ``HUNTER_*`` variables:
``$HUNTER_ROOT``, else the file's ``root``, else ``./.hunter``); `supervisor.cli.client.locate`.

The sandbox package sits below the daemon and cannot read its configuration, so this module
adds ``--config`` to those commands through `sandbox.cli.extend` and resolves the root before
their handler runs (a configuration that cannot be read: exit 2, naming the key or file).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence

from sandbox import cli as sandbox_cli
from supervisor.cli.client import locate
from supervisor.cli.exit_codes import EXIT_USAGE
from supervisor.cli.output import err

__all__ = ["ROOT_HELP", "register"]

ROOT_HELP = (
    "the root (default: $HUNTER_ROOT, else the root of the config file --config FILE or"
    " $HUNTER_CONFIG, else ./.hunter)"
)

Handler = Callable[[argparse.Namespace], int]


def register(parsers: Sequence[argparse.ArgumentParser]) -> None:
    """Add ``--config`` to each of *parsers* and find the root before their handler runs."""
    for parser in parsers:
        root = parser._option_string_actions.get("--root")
        if root is not None:
            root.help = ROOT_HELP
        parser.add_argument(
            "--config",
            metavar="FILE",
            help="the daemon's TOML config file (default $HUNTER_CONFIG): its root",
        )
        plain: Handler = parser.get_default("handler")
        parser.set_defaults(handler=functools.partial(_with_root, plain=plain))


def _with_root(args: argparse.Namespace, *, plain: Handler) -> int:
    from supervisor.errors import ConfigError

    if getattr(args, "root", None) is None:
        try:
            args.root = locate(args, "root").path
        except ConfigError as exc:
            command = " ".join(filter(None, ("hunter package", args.package_command)))
            err(f"{command}: {exc}; it is read to find the root (fix it, or give --root DIR)")
            return EXIT_USAGE
    return plain(args)


sandbox_cli.extend(register)
