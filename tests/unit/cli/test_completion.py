"""Bash completion: made from the parser, shipped by the RPM, answered by a real bash."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nodeagent.cli import main as cli
from nodeagent.cli.completion import render_bash
from nodeagent.cli.options import command_paths

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "packaging" / "nodeagent.bash-completion"
SPEC = ROOT / "packaging" / "nodeagent.spec"
BASH = shutil.which("bash")


def complete(words: list[str]) -> list[str]:
    """``COMPREPLY`` for the command line ``words`` (the last one being completed)."""
    assert BASH is not None
    array = " ".join(f"'{w}'" for w in words)
    script = (
        f"source {SHIPPED}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; "
        '_nodeagent; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        [BASH, "--norc", "--noprofile", "-c", script],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=30,
    )  # fmt: skip
    return [line for line in done.stdout.splitlines() if line]


def test_the_shipped_script_is_the_parsers(capsys: pytest.CaptureFixture[str]) -> None:
    """Regenerate with: nodeagent completion bash > packaging/nodeagent.bash-completion"""
    assert cli.main(["completion", "bash", "--config", "/nonexistent.toml"]) == 0
    assert capsys.readouterr().out == SHIPPED.read_text() == render_bash(cli._parser())


def test_the_spec_installs_and_lists_it() -> None:
    spec = SPEC.read_text()
    install = re.search(
        r"^install -Dm0644 packaging/nodeagent\.bash-completion "
        r"%\{buildroot\}%\{bash_completions_dir\}/nodeagent$", spec, re.M,
    )  # fmt: skip
    assert install is not None
    assert re.search(r"^%\{bash_completions_dir\}/nodeagent$", spec, re.M)
    found = re.search(r"^%\{!\?bash_completions_dir:%global bash_completions_dir (\S+)\}$",
                      spec, re.M)  # fmt: skip
    assert found is not None and found.group(1) == "%{_datadir}/bash-completion/completions"


@pytest.mark.needs("bash")
@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["nodeagent", "ren"], ["render-mirror-dropin", "render-pins"]),
        (["nodeagent", "st"], ["status", "store"]),
        (["nodeagent", "--config", "/etc/x.toml", "check-"], ["check-config", "check-offline"]),
        (["nodeagent", "render-pins", "--w"], ["--write"]),
        (["nodeagent", "render-pins", "--c"], ["--config"]),
        (["nodeagent", "bundle", "v"], ["verify"]),
        (["nodeagent", "bundle", "import", "--allow-r"], ["--allow-rollback"]),
        (["nodeagent", "store", "--json", "v"], ["verify"]),
        (["nodeagent", "site", "wait", "--ti"], ["--timeout"]),
        (["nodeagent", "completion", "b"], ["bash"]),
    ],
)
def test_bash_completes_commands_and_options(words: list[str], expected: list[str]) -> None:
    assert sorted(complete(words)) == expected


@pytest.mark.needs("bash")
def test_every_command_is_offered_with_its_global_options() -> None:
    parser = cli._parser()
    top = sorted(words[0] for words, _ in command_paths(parser) if len(words) == 1)
    assert sorted(complete(["nodeagent", ""])) == top
    for words, _each in command_paths(parser):
        offered = complete(["nodeagent", *words, "--"])
        assert {"--config", "--root", "--json", "--version"} <= set(offered), words


@pytest.mark.needs("bash")
def test_a_path_option_completes_file_names() -> None:
    assert "pyproject.toml" in complete(["nodeagent", "--config", "pyproj"])
