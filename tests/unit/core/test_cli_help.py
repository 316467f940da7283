"""Every option of every command says what it does in ``--help``."""

from __future__ import annotations

import argparse

from repromatrix.cli import build_parser


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its path (``scenario draft``), nested ones included."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = sub
                found.update({f"{name} {k}": v for k, v in commands(sub).items()})
    return found


def test_every_option_has_help_text() -> None:
    everything = commands(build_parser())
    assert {"run", "watch", "bisect", "plan"} <= set(everything)
    silent = [
        f"{name} {'/'.join(action.option_strings)}"
        for name, parser in everything.items()
        for action in parser._actions
        if action.option_strings and not (action.help or "").strip()
    ]
    assert silent == []
