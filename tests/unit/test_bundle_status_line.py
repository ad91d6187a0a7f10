"""STATUS= while a bundle is copied into the store and imported (``status.bundle_line``,
``reporting.Reporter.bundle_report``)."""

from __future__ import annotations

from dataclasses import replace

from nodeagent.progress import ByteProgress
from nodeagent.reporting import Reporter
from nodeagent.status import BundleReport, NodeStatus, bundle_line
from tests.fakes.ports import MemoryStore, RecordingLine

MIB = 1024**2


def storing(done: int, total: int) -> BundleReport:
    progress = ByteProgress(done, total, 38.2e6, (total - done) / 38.2e6, 3.0)
    return BundleReport(
        "/dev/sdb1",
        "storing",
        bundle_id="line-3",
        images_total=12,
        progress=progress.to_json(),
        progress_text=progress.describe(),
    )


def test_lines_say_what_is_copied_how_fast_and_when_the_medium_may_go() -> None:
    assert bundle_line(storing(312 * MIB, 1024 * MIB)) == (
        "bundle line-3: copying to the image store: 312 MiB of 1 GiB (30 %), 38.2 MB/s, "
        "about 20 s left"
    )
    stored = BundleReport("/dev/sdb1", "stored", bundle_id="line-3", is_medium_removable=True)
    assert bundle_line(stored) == "bundle line-3 stored: the medium may be removed"
    importing = BundleReport("/dev/sdb1", "importing", bundle_id="line-3", images_total=12)
    assert bundle_line(importing) == "bundle line-3: importing 12 images"
    assert bundle_line(BundleReport("/dev/sdb1", "verified", bundle_id="line-3")) is None


def test_a_bundle_fetched_from_peers_says_so_and_names_no_medium() -> None:
    fetching = replace(storing(312 * MIB, 1024 * MIB), source="peers:line-3", state="fetching")
    assert bundle_line(fetching) == (
        "bundle line-3: fetching from peers: 312 MiB of 1 GiB (30 %), 38.2 MB/s, about 20 s left"
    )
    stored = BundleReport("peers:line-3", "stored", bundle_id="line-3")
    assert bundle_line(stored) == "bundle line-3 stored: verified in the image store"


def test_the_reporter_shows_bundle_steps_then_the_sync_line_again() -> None:
    line, store = RecordingLine(), MemoryStore()
    reporter = Reporter(line=line, store=store)
    reporter.sync_finished(NodeStatus(sets=(), conditions=()))
    reporter.bundle_report(BundleReport("/dev/sdb1", "verified", bundle_id="line-3"))
    reporter.bundle_report(storing(1 * MIB, 2 * MIB))
    reporter.bundle_report(BundleReport("/dev/sdb1", "imported", bundle_id="line-3"))
    assert line.lines[1:] == [
        "bundle line-3: copying to the image store: 1 MiB of 2 MiB (50 %), 38.2 MB/s, "
        "about 0 s left",
        line.lines[0],  # the sync's own line once the import is done
    ]
    saved = store.docs["status"]["bundles"][0]
    assert saved["state"] == "imported"
