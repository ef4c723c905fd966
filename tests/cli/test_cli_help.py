"""Every subcommand and every option of `toolbus` says what it is for (`--help`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from toolbus.cli.main import _parser


def actions(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str | None]]:
    """(where, help) for every action in the tree, subcommands included."""
    for action in parser._actions:
        name = "/".join(action.option_strings) or action.dest
        yield f"{path} {name}", action.help
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for command, sub in action.choices.items():
                yield f"{path} {command}", helps.get(command)
                yield from actions(sub, f"{path} {command}")


def test_every_option_and_subcommand_has_help() -> None:
    found = dict(actions(_parser(), "toolbus"))
    assert {"toolbus call", "toolbus bench", "toolbus schemas --write"} <= set(found)
    missing = sorted(where for where, text in found.items() if not (text and text.strip()))
    assert missing == []


def test_help_renders_for_every_subcommand() -> None:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, subparser in sub.choices.items():
        assert command in subparser.format_help()
