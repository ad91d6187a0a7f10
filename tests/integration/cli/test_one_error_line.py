"""Every command's failure is one ``error:`` line: the reason, what happened, what to do.

Each command (found in the real parser, so a new one fails here until it has a case) is run
through ``python -m nodeagent`` into its failure modes: a bad configuration, a bad
argument, a missing or damaged file, a bundle that is none, a stick that is not there, a
CRI-O or an API server that does not answer. stderr must be exactly one line of the form
``error: Reason: message; what to do: hint`` (``cli.output.error_line``): no traceback, no
journal line, no second line. The exit code is the reason's (decision 0073).

Verdicts are not failures: ``check-offline`` and ``site wait`` say "not ready" and "could
not check" in their own words and exit codes (1 or 75 for check-offline, checked here).
About 6 s (the commands run two at a time).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.cli import main as cli

pytestmark = pytest.mark.integration

ONE_LINE = re.compile(r"error: (?P<reason>[A-Z][A-Za-z]+): .+; what to do: .+")
DAEMONS = {"run", "serve-peers", "serve-mirror", "serve-session"}
"""Started by systemd: their failures are the journal's; only a bad configuration or a bad
argument, before they start, is a line here."""


@dataclass(frozen=True)
class Case:
    command: str
    argv: tuple[str, ...]
    reason: str
    exit_code: int


def _leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[str]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(prefix)
        return
    for name, child in subs[0].choices.items():
        yield from _leaves(child, (*prefix, name))
    if not subs[0].required and prefix:  # ``store`` alone is a command too
        yield " ".join(prefix)


def cases(tmp: Path) -> list[Case]:
    """The failure modes, in a root of their own under ``tmp``."""
    (tmp / "state").mkdir()
    (tmp / "empty").mkdir()
    (tmp / "existing.key").write_text("")
    good = tmp / "node.toml"
    good.write_text(
        f'[state]\ndir = "{tmp / "state"}"\nrun_dir = "{tmp / "run"}"\n'
        f'[runtime]\nendpoint = "unix://{tmp / "no.sock"}"\n'
        f'[bundles]\ntrusted_keys_dir = "{tmp / "keys"}"\nmedia_dir = "{tmp / "media"}"\n'
    )
    bad = tmp / "bad.toml"
    bad.write_text("[runtime\n")
    unreachable = tmp / "kubeconfig"
    unreachable.write_text(
        "apiVersion: v1\nkind: Config\n"
        'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]\n'
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    broken_kube = tmp / "broken-kubeconfig"
    broken_kube.write_text("apiVersion: v1\nclusters: []\n")
    damaged = tmp / "damaged"
    (damaged / "state").mkdir(parents=True)
    (damaged / "state" / "status.json").write_text("{bad")
    damaged_conf = tmp / "damaged.toml"
    damaged_conf.write_text(f'[state]\ndir = "{damaged / "state"}"\n')
    fresh = tmp / "fresh.toml"  # a state directory no import writes a status into
    fresh.write_text(f'[state]\ndir = "{tmp / "fresh"}"\nrun_dir = "{tmp / "fresh-run"}"\n')
    g, b = ("--config", str(good)), ("--config", str(bad))

    def case(
        command: str, argv: list[str], reason: str, code: int, conf: tuple[str, ...] = g
    ) -> Case:
        return Case(command, (*command.split(), *argv, *conf), reason, code)

    return [
        *(case(name, [], "ConfigInvalid", 78, b) for name in ("run", "check-config", "status")),
        *(case(name, ["--no-such-option"], "UsageInvalid", 2) for name in DAEMONS),
        case("render-pins", [], "ConfigInvalid", 78, b),
        case("render-mirror-dropin", [], "ConfigInvalid", 78, b),
        case("status", [], "StatusMissing", 1, ("--config", str(fresh))),
        case("status", [], "StateFileDamaged", 74, ("--config", str(damaged_conf))),
        case("runtime", [], "RuntimeUnreachable", 69),
        case("pull", [f"q.example/a@sha256:{'a' * 64}"], "RuntimeUnreachable", 69),
        case("pull", [], "UsageInvalid", 2),
        case("check-offline", ["--bogus"], "UsageInvalid", 2),
        case("bundle verify", [str(tmp / "none")], "HostFileError", 74),
        case("bundle verify", [str(tmp / "empty")], "BundleIncomplete", 65),
        case("bundle import", [str(tmp / "none")], "HostFileError", 65),
        case("bundle import", [str(tmp / "empty")], "BundleIncomplete", 65),
        case("bundle import", ["LABEL=NO-SUCH-STICK-x"], "MediaMountFailed", 74),
        case("bundle import", ["LABEL=a/b"], "MediaMountFailed", 74),
        case(
            "bundle create",
            ["--key", str(tmp / "nokey"), "--output", str(tmp / "o")],
            "SigningKeyMalformed",
            78,
        ),
        case("bundle create", ["--sequence", "-1"], "UsageInvalid", 2),
        case(
            "bundle keygen",
            ["--name", "existing", "--unencrypted", "--output-dir", str(tmp)],
            "HostFileError",
            74,
        ),
        case("bundle release-signatures", ["nosuch"], "BundleIncomplete", 65),
        case("bundle remove", ["no-such-bundle"], "BundleNotStored", 66),
        case("unpin", ["no-such-set"], "SetNotFound", 66),
        case("support-dump", ["--output", str(tmp / "existing.key")], "HostFileError", 74),
        case("store", ["--bogus"], "UsageInvalid", 2),
        case("store verify", [], "ConfigInvalid", 78, b),
        case("site status", ["--kubeconfig", str(broken_kube)], "KubeconfigInvalid", 78),
        case("site status", ["--kubeconfig", str(unreachable)], "ApiUnreachable", 69),
        case(
            "site wait", ["--bundle", "b", "--kubeconfig", str(unreachable)], "ApiUnreachable", 69
        ),
        case("site wait", [], "UsageInvalid", 2),
        case("completion", ["fish"], "UsageInvalid", 2),
        case("no-such-command", [], "UsageInvalid", 2),
    ]


def _run(argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodeagent", *argv],
        capture_output=True, text=True, timeout=50, check=False,
    )  # fmt: skip


def test_every_command_has_a_failure_case(tmp_path: Path) -> None:
    commands = set(_leaves(cli._parser()))
    covered = {c.command for c in cases(tmp_path)}
    assert commands - covered == set(), "a command without a failure case"


def test_every_failure_is_one_error_line_with_its_reason_and_exit_code(tmp_path: Path) -> None:
    everything = cases(tmp_path)
    # the imports take the pin lock of one run_dir: one at a time, or one says DaemonRunning
    locking = [c for c in everything if c.command == "bundle import"]
    found = [*locking, *(c for c in everything if c.command != "bundle import")]
    with ThreadPoolExecutor(2) as pool:
        imports = pool.submit(lambda: [_run(c.argv) for c in locking])
        rest = list(pool.map(lambda c: _run(c.argv), found[len(locking) :]))
        done = [*imports.result(), *rest]
    wrong = []
    for case, result in zip(found, done, strict=True):
        lines = result.stderr.splitlines()
        matched = ONE_LINE.fullmatch(lines[0]) if len(lines) == 1 else None
        if matched is None or (matched["reason"], result.returncode) != (
            case.reason,
            case.exit_code,
        ):
            wrong.append((" ".join(case.argv[:4]), result.returncode, result.stderr[-600:]))
    assert wrong == [], "\n".join(map(str, wrong))


@pytest.mark.parametrize(
    ("prepare", "verdict", "code"),
    [(lambda tmp: None, "COULD NOT CHECK", 75)],
    ids=["runtime-unreachable"],
)
def test_check_offline_says_could_not_check_not_not_ready(
    tmp_path: Path, prepare: Callable[[Path], None], verdict: str, code: int
) -> None:
    found = {c.command: c for c in cases(tmp_path)}
    prepare(tmp_path)
    result = _run(("check-offline", *found["runtime"].argv[1:]))
    assert result.returncode == code, result.stdout + result.stderr
    assert result.stdout.startswith(f"{verdict}: "), result.stdout
    assert "NOT offline-ready" not in result.stdout and "Traceback" not in result.stderr
