"""``nodeagent status``: the work in flight with bytes, rate and time left, each bundle's last
outcome; a compact table on a terminal, plain grep-friendly lines in a pipe; outside text
escaped. The status file comes from the daemon's own reporter (``reported_status``)."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from nodeagent.cli import main as cli
from nodeagent.cli import status_view
from nodeagent.cli.status_view import Work, bundle_outcome, eta_of, work_items
from tests.unit.cli.test_json_documents import reported_status

MIB = 1 << 20


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_status(tmp_path: Path, *, is_terminal: bool, monkeypatch: pytest.MonkeyPatch) -> str:
    stream = Terminal() if is_terminal else io.StringIO()
    monkeypatch.setattr(sys, "stdout", stream)
    assert cli.main(["status", "--root", str(tmp_path)]) == 0
    return stream.getvalue()


@pytest.fixture
def root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    reported_status(tmp_path / "var/lib/nodeagent")
    capsys.readouterr()
    return tmp_path


def test_a_pipe_gets_one_fact_per_line(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = run_status(root, is_terminal=False, monkeypatch=monkeypatch).splitlines()
    assert (
        "in flight: bundle line-3: copying to the image store: 312 MiB of 1 GiB, "
        "rate 38.2 MB/s, time left 20 s"
    ) in lines
    assert (
        "in flight: pulls: 1/3 images of 300 MiB, rate unknown, time left unknown "
        "(1 of 3 images, 0 pulling, 0 failed, since 2026-09-21T14:13:20+00:00)"
    ) in lines
    assert (
        "bundle line-4 outcome: refused: BundleSignatureInvalid: the signature does not match"
        in lines
    )
    assert "bundle line-3 outcome: in progress" in lines
    assert (
        "set apps: Progressing (generation 1/2), images 0 pinned, 0 present, 3 total, 0 failed"
        in lines
    )


def test_a_terminal_gets_a_compact_table(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = run_status(root, is_terminal=True, monkeypatch=monkeypatch)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("IN FLIGHT"))
    assert header.split() == ["IN", "FLIGHT", "DONE", "TOTAL", "RATE", "LEFT"]
    rows = lines[lines.index(header) + 1 : lines.index(header) + 3]
    assert rows[0].split("  ")[0] == "bundle line-3: copying to the image store"
    cells = [re.split(r"\s{2,}", row) for row in rows]
    assert cells[0][1:] == ["312 MiB", "1 GiB", "38.2 MB/s", "20 s"]
    assert cells[1] == ["pulls", "1/3 images", "300 MiB", "unknown", "unknown"]
    column = header.index("RATE")
    assert rows[0][column:].startswith("38.2 MB/s")  # columns line up under their header
    bundles = next(line for line in lines if line.startswith("BUNDLE"))
    assert bundles.split() == ["BUNDLE", "STATE", "IMAGES", "LAST", "OUTCOME"]
    assert any(
        line.startswith("line-4") and "refused: BundleSignatureInvalid" in line for line in lines
    )
    assert not any(line.startswith("in flight:") for line in lines)


def test_outside_text_is_escaped_in_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = {
        "conditions": [],
        "pinnedImageSets": [
            {"name": "evil\x1b[2J", "state": "Pinned", "desiredGeneration": 1,
             "currentGeneration": 1,
             "images": {"total": 1, "present": 1, "pinned": 1, "failed": 0}},
        ],
        "bundles": [
            {"source": "/dev/sdb1", "bundleId": "b\x1b]0;x\x07", "state": "storing",
             "images": {"total": 1, "present": 0},
             "progress": {"doneBytes": 1, "totalBytes": 2, "bytesPerSecond": None,
                          "etaSeconds": None}},
        ],
    }  # fmt: skip
    for render in (status_view.print_status, status_view.print_table):
        stream = io.StringIO()
        monkeypatch.setattr(sys, "stdout", stream)
        render(doc)
        text = stream.getvalue()
        assert "\x1b" not in text and "\x07" not in text
        assert "evil\\x1b[2J" in text and "b\\x1b]0;x\\x07" in text


def test_time_left_only_with_a_total_and_a_rate() -> None:
    assert eta_of(100, 300, 50.0) == 4.0
    assert eta_of(100, None, 50.0) is None  # total unknown: never guessed
    assert eta_of(100, 0, 50.0) is None
    assert eta_of(100, 300, None) is None
    assert eta_of(100, 300, 0.0) is None
    assert eta_of(None, 300, 50.0) is None


def test_work_items_read_bundle_progress_and_pulls() -> None:
    doc = {
        "bundles": [
            {"bundleId": "a", "state": "fetching",
             "progress": {"doneBytes": 10 * MIB, "totalBytes": 20 * MIB,
                          "bytesPerSecond": MIB, "etaSeconds": 10}},
            {"bundleId": "b", "state": "pinned"},
            {"bundleId": "c", "state": "importing", "progress": {"doneBytes": 5, "totalBytes": 0,
                                                                   "bytesPerSecond": 1}},
        ],
        "pulls": {"startedAt": "t", "images": {"total": 2, "done": 0}, "bytes": {"total": None}},
    }  # fmt: skip
    assert work_items(doc) == [
        Work("bundle a: fetching from peers", 10 * MIB, 20 * MIB, MIB, 10.0),
        Work("bundle c: importing into the runtime", 5, None, 1.0, None),
        Work("pulls", None, None, None, None,
             "0 of 2 images, 0 pulling, 0 failed, since t", "0/2 images"),
    ]  # fmt: skip


def test_sized_pulls_show_bytes_rate_and_time_left() -> None:
    doc = {
        "pulls": {"startedAt": "t", "images": {"total": 3, "done": 1},
                  "bytes": {"total": 300 * MIB, "done": 100 * MIB}, "bytesPerSecond": 10 * MIB},
    }  # fmt: skip
    (work,) = work_items(doc)
    assert (work.done_bytes, work.total_bytes, work.rate_bytes_per_s) == (
        100 * MIB,
        300 * MIB,
        10 * MIB,
    )
    assert work.eta_s == 20.0  # 200 MiB left at 10 MiB/s
    assert work.done_text() == "100 MiB (1/3 images)"
    assert work.eta_text() == "20 s"


@pytest.mark.parametrize(
    ("bundle", "outcome"),
    [
        ({"state": "stored"}, "verified, stored"),
        ({"state": "pinned"}, "imported, pinned"),
        ({"state": "imported"}, "imported"),
        ({"state": "rejected", "reason": "BundleExpired", "message": "past"},
         "refused: BundleExpired: past"),
        ({"state": "storing"}, "in progress"),
        ({"state": "interrupted", "reason": "BundleMediaRemoved", "message": "pulled out"},
         "interrupted: BundleMediaRemoved: pulled out"),
    ],
)  # fmt: skip
def test_last_outcome_of_a_bundle(bundle: dict[str, str], outcome: str) -> None:
    assert bundle_outcome(bundle) == outcome
