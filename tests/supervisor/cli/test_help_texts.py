"""Every option and argument of every `hunter` subcommand says what it is for in `--help`
(issue 21: `serve --log-format` and `submit --url/--selector/--param` said nothing)."""

from __future__ import annotations

import argparse

from supervisor.cli import build_parser


def _undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """`hunter serve --log-format`-style names of the arguments under *parser* with no help,
    and of the subcommands with none, walking every level of subcommands."""
    missing: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            documented = {choice.dest for choice in action._choices_actions if choice.help}
            for name, sub in action.choices.items():
                if name not in documented and sub.description is None:
                    missing.append(f"{path} {name} (the subcommand)")
                missing += _undocumented(sub, f"{path} {name}")
        elif isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        elif not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_of_every_subcommand_has_help() -> None:
    """Walk the whole argparse tree (the daemon's commands and those of the sandbox, ledger and
    config areas): an option or positional argument without a help text fails, by name."""
    assert _undocumented(build_parser(), "hunter") == []


def test_the_walk_finds_an_option_without_help() -> None:
    """The walk itself sees a missing help two levels down."""
    parser = argparse.ArgumentParser(prog="hunter")
    sub = parser.add_subparsers().add_parser("serve", help="run").add_subparsers()
    sub.add_parser("now", help="at once").add_argument("--log-format")
    assert _undocumented(parser, "hunter") == ["hunter serve now --log-format"]
