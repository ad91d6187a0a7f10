"""``nodeagent site wait``'s exit codes against a scripted API (the real one: tests/integration)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeagent.cli import main as cli
from nodeagent.cli import site as cli_site
from nodeagent.cluster.kinds import NODE, ResourceKind
from nodeagent.errors import ApiUnreachable, TransientError

BUNDLE = "edge-4.18.3"
Read = Callable[[], tuple[list[dict[str, Any]], list[dict[str, Any]]]]


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}}}


def status(name: str, state: str) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC).isoformat()
    return {
        "metadata": {"name": name},
        "status": {"lastHeartbeatTime": now, "bundles": [{"bundleId": BUNDLE, "state": state}]},
    }


def down() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    raise ApiUnreachable("list nodes: the API server does not answer: refused")


class ScriptedApi:
    """Answers each poll with the next step of ``script`` (the last one repeats)."""

    def __init__(self, script: list[Read]) -> None:
        self.script = script
        self.polls = 0
        self.is_closed = False

    async def list(self, kind: ResourceKind) -> tuple[list[dict[str, Any]], str]:
        """A poll lists Nodes first, then NodeImageStatuses."""
        if kind == NODE:
            self.polls += 1
        nodes, statuses = self.script[min(self.polls, len(self.script)) - 1]()
        return (nodes if kind == NODE else statuses), "1"

    async def close(self) -> None:
        self.is_closed = True


def run_wait(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script: list[Read], *args: str
) -> tuple[int, ScriptedApi]:
    api = ScriptedApi(script)
    monkeypatch.setattr(cli_site, "_api", lambda _config, _args: api)
    argv = ["--root", str(tmp_path), "site", "wait", "--bundle", BUNDLE, "--interval", "0.01"]
    return cli.main([*argv, *args]), api


def both(state: str) -> Read:
    return lambda: ([node("a"), node("b")], [status("a", "pinned"), status("b", state)])


def test_a_blip_after_the_first_read_is_waited_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, api = run_wait(
        monkeypatch, tmp_path, [both("importing"), down, down, both("pinned")], "--timeout", "30"
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == f"bundle {BUNDLE}: 2/2 nodes pinned, 2 holding, 0 failing\n"
    assert err.count("warning: ApiUnreachable") == 1
    assert api.is_closed


def test_unreachable_at_the_first_read_exits_69_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, api = run_wait(monkeypatch, tmp_path, [down], "--timeout", "3600")
    assert code == ApiUnreachable.exit_code == 69
    assert "error: ApiUnreachable" in capsys.readouterr().err
    assert api.is_closed


def test_still_unreachable_at_the_deadline_exits_69(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = run_wait(monkeypatch, tmp_path, [both("importing"), down], "--timeout", "0.2")
    assert code == 69
    assert "error: ApiUnreachable" in capsys.readouterr().err


def test_timeout_exits_75_naming_each_laggard(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def read() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return [node("a"), node("b"), node("c")], [status("a", "pinned"), status("b", "stored")]

    code, api = run_wait(monkeypatch, tmp_path, [read], "--timeout", "0.2")
    err = capsys.readouterr().err
    assert code == TransientError.exit_code == 75
    assert "error: timed out after 0.2 s" in err
    assert "  b: stored\n" in err
    assert "  c: no status" in err
    assert "  a:" not in err
    assert api.polls >= 2


def test_an_empty_scope_never_passes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = run_wait(
        monkeypatch,
        tmp_path,
        [lambda: ([node("a")], [status("a", "pinned")])],
        "--timeout",
        "0.1",
        "--selector",
        "role=edge",
    )
    assert code == 75
    assert "no Node in scope" in capsys.readouterr().err


def test_a_bad_selector_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, _ = run_wait(monkeypatch, tmp_path, [both("pinned")], "--selector", "a in b")
    assert code == 78


def test_status_with_a_set_but_no_bundle_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = ScriptedApi([both("pinned")])
    monkeypatch.setattr(cli_site, "_api", lambda _config, _args: api)
    code = cli.main(["--root", str(tmp_path), "site", "status", "--set", "upgrade"])
    assert code == 78
    assert "needs --bundle" in capsys.readouterr().err
    assert api.polls == 0
