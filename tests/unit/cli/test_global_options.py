"""Every global option works before and after every command and nested subcommand.

The commands are found by walking the real parser (``cli.options.command_paths``), so a
command added later is checked without a line here. Each is parsed with its required
arguments filled in; each global option given before, after, and between the words of a
nested command must reach the namespace, and one given only before must not be reset by
a default after the command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nodeagent.cli import main as cli
from nodeagent.cli.options import GLOBAL_OPTIONS, command_paths
from nodeagent.config import DEFAULT_CONFIG_PATH

PARSER = cli._parser()
COMMANDS = [words for words, _parser in command_paths(PARSER)]
LEAVES = [
    (words, parser)
    for words, parser in command_paths(PARSER)
    if not any(isinstance(a, argparse._SubParsersAction) and a.required for a in parser._actions)
]


def required_args(parser: argparse.ArgumentParser) -> list[str]:
    """Values for a command's required positionals and options (parsing only: any text)."""
    argv: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if not action.option_strings and action.nargs not in ("?", "*"):
            argv.append(str(next(iter(action.choices))) if action.choices else "x")
        elif action.option_strings and action.required:
            argv += [action.option_strings[0], "x"]
    return argv


def test_the_walk_finds_every_command_and_nested_subcommand() -> None:
    names = {" ".join(words) for words in COMMANDS}
    expected = {"run", "check-config", "render-pins", "status", "runtime", "check-offline"}
    expected |= {"pull", "bundle create", "bundle verify", "bundle import", "site wait"}
    expected |= {"bundle release-signatures", "store", "store verify", "site status"}
    assert expected <= names
    assert set(GLOBAL_OPTIONS) == {"--config", "--root", "--json", "--version"}


def globals_given(config: Path, root: Path) -> list[str]:
    return ["--config", str(config), "--root", str(root), "--json"]


def check(args: argparse.Namespace, config: Path, root: Path) -> None:
    assert (args.config, args.root, args.json) == (config, root, True)


@pytest.mark.parametrize("words", [w for w, _ in LEAVES], ids=" ".join)
@pytest.mark.parametrize("side", ["before", "after", "between"])
def test_each_global_option_on_each_side(words: tuple[str, ...], side: str) -> None:
    parser = dict(LEAVES)[words]
    config, root = Path("/c/nodeagent.toml"), Path("/r")
    given, rest = globals_given(config, root), required_args(parser)
    if side == "before":
        argv = [*given, *words, *rest]
    elif side == "after":
        argv = [*words, *rest, *given]
    else:  # after the first word: inside a nested command, else among its arguments
        argv = [words[0], *given, *words[1:], *rest]
    check(cli._parser(cli._command_of(argv)).parse_args(argv), config, root)


@pytest.mark.parametrize("words", [w for w, _ in LEAVES], ids=" ".join)
def test_a_value_given_before_is_not_reset_by_a_default_after(words: tuple[str, ...]) -> None:
    config, root = Path("/c/nodeagent.toml"), Path("/r")
    argv = [*globals_given(config, root), *words, *required_args(dict(LEAVES)[words])]
    check(PARSER.parse_args(argv), config, root)
    bare = PARSER.parse_args([*words, *required_args(dict(LEAVES)[words])])
    assert (bare.config, bare.json) == (DEFAULT_CONFIG_PATH, False)


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_version_is_answered_after_every_command(
    words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        PARSER.parse_args([*words, "--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("nodeagent ")


def test_a_later_value_wins_over_an_earlier_one() -> None:
    args = PARSER.parse_args(["--root", "/first", "status", "--root", "/second"])
    assert args.root == Path("/second")


def test_render_pins_with_its_config_after_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's example: ``nodeagent render-pins --config FILE``, run for real (the file
    is a host path, read under ``--root``)."""
    (tmp_path / "etc/crio/crio.conf.d").mkdir(parents=True)
    (tmp_path / "etc/pins.toml").write_text('[runtime]\ndropin_name = "05-pins.conf"\n')
    argv = ["render-pins", "--write", "--config", "/etc/pins.toml", "--root", str(tmp_path)]
    assert cli.main(argv) == 0
    assert "05-pins.conf" in capsys.readouterr().out
    (tmp_path / "etc/bad.toml").write_text("[runtime\n")
    assert cli.main(["render-pins", "--config", "/etc/bad.toml", "--root", str(tmp_path)]) == 78
    assert "bad.toml is not valid TOML" in capsys.readouterr().err


def test_docs_cli_md_documents_every_command_and_option() -> None:
    """docs/cli.md has a section per command (found by walking the parser) naming each of
    its own options."""
    docs = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text()
    headings = [line[4:] for line in docs.splitlines() if line.startswith("### nodeagent ")]
    for words, parser in command_paths(PARSER):
        if any(isinstance(a, argparse._SubParsersAction) and a.required for a in parser._actions):
            continue  # `bundle`, `site`: their subcommands have the sections
        name = "nodeagent " + " ".join(words)
        exact = [h for h in headings if h == name]
        section = (exact or [h for h in headings if h.startswith(name + " ")] or [name])[0]
        assert section in headings, name
        body = section + docs.split("### " + section, 1)[1].split("\n### ", 1)[0]
        for action in parser._actions:
            for option in action.option_strings:
                if option.startswith("--") and option not in (*GLOBAL_OPTIONS, "--help"):
                    assert f"`{option}" in body, (name, option)
