"""``check-offline``'s words tell "not ready" from "could not check" (issue 28): it said
"NOT offline-ready" while its exit code (75) said it could not look."""

from __future__ import annotations

import pytest

from nodeagent.cli.offline import EXIT_INCOMPLETE, EXIT_NOT_READY, exit_code, print_report
from nodeagent.offline import findings as f
from nodeagent.offline.findings import Finding, OfflineReport

COULD_NOT = Finding(f.CHECK_INCOMPLETE, "could not read the kubelet configuration", "fix it")
MISSING = Finding("PauseImageMissing", "the pause image is not pinned", "pin it")


def test_only_checks_that_could_not_look_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    report = OfflineReport((COULD_NOT,), ("pins",))
    print_report(report)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("COULD NOT CHECK: 1 check(s) could not look")
    assert "NOT offline-ready" not in first and exit_code(report) == EXIT_INCOMPLETE


def test_a_real_finding_is_not_ready(capsys: pytest.CaptureFixture[str]) -> None:
    report = OfflineReport((COULD_NOT, MISSING), ("pins",))
    print_report(report)
    assert capsys.readouterr().out.startswith("NOT offline-ready: 2 finding(s)")
    assert exit_code(report) == EXIT_NOT_READY
