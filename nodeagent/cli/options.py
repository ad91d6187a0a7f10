"""The global options, accepted before or after any command and nested subcommand.

``--config``, ``--root``, ``--json`` and ``--version`` are added once to the top parser
(with their defaults) and, after every command module registered its parsers, to every
subparser found by walking the parser (``add_everywhere``), with ``default=SUPPRESS``:
a subparser sets an option only when it is given there, so a value given before the
command is not overwritten by a default after it, and a value given after wins. A
command added later is covered without a line of its own.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

from nodeagent import __version__
from nodeagent.config import DEFAULT_CONFIG_PATH

GLOBAL_OPTIONS = ("--config", "--root", "--json", "--version")
"""Every global option; tests check each on both sides of every command."""


def add_global_options(parser: argparse.ArgumentParser, *, is_top: bool) -> None:
    """The global options on ``parser``: with defaults at the top, suppressed below it."""

    def default(value: object) -> object:
        return value if is_top else argparse.SUPPRESS

    parser.add_argument(
        "--version", action="version", version=f"nodeagent {__version__}",
        help="print nodeagent's version and exit",
    )  # fmt: skip
    parser.add_argument(
        "--config", type=Path, default=default(DEFAULT_CONFIG_PATH),
        help=f"main config file (default {DEFAULT_CONFIG_PATH})",
    )  # fmt: skip
    parser.add_argument(
        "--root", type=Path, default=default(os.environ.get("NODEAGENT_ROOT") or None),
        help="put every host path under this directory (env NODEAGENT_ROOT)",
    )  # fmt: skip
    parser.add_argument(
        "--json", action="store_true", default=default(False),
        help="machine-readable output, versioned (docs/cli.md)",
    )  # fmt: skip


def command_paths(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command and nested subcommand: (words, its parser), parents first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, child in action.choices.items():
                if id(child) in seen:
                    continue
                seen.add(id(child))
                yield (*prefix, name), child
                yield from command_paths(child, (*prefix, name))


def add_everywhere(parser: argparse.ArgumentParser) -> None:
    """The global options on every subparser below ``parser`` (suppressed defaults)."""
    for _words, child in command_paths(parser):
        add_global_options(child, is_top=False)


def early_parser() -> argparse.ArgumentParser:
    """Finds the command word without the full parser (global options skipped)."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--config")
    early.add_argument("--root")
    early.add_argument("--json", action="store_true")
    early.add_argument("command", nargs="?")
    return early
