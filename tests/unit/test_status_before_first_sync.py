"""A status written before this run's first sync by a by-hand ``bundle import`` refused
before its sync keeps what the status file of this boot says is pinned, and claims nothing
from another boot (``reporting.Reporter.save`` with the boot id the CLI's wiring gives it;
the daemon's gives none, ``daemon.wiring.build``: after a crash within a boot the runtime
may have lost what the file says). Found by the single-disk drill: a refused import's
status said no set was pinned while CRI-O pinned two; the daemon keeping the file's sets
was then caught by the site power-cut drill (a status claiming pins CRI-O had lost)."""

from __future__ import annotations

from typing import Any

from nodeagent.reporting import Reporter
from nodeagent.status import BundleReport
from tests.fakes.ports import MemoryStore, RecordingLine

BOOT = "0f5e4b6a-0000-4000-8000-000000000001"
OTHER_BOOT = "0f5e4b6a-0000-4000-8000-000000000002"


def last_run(boot_id: str) -> dict[str, Any]:
    return {
        "updatedAt": "2026-11-28T10:00:00Z",
        "bootId": boot_id,
        "conditions": [{"type": "Pinned", "status": "True"}],
        "pinnedImageSets": [{"name": "release-4.16.1", "state": "Pinned"}],
        "bundles": [{"bundleId": "old", "state": "imported"}],
        "pulls": {"active": 0},
    }


REFUSED = BundleReport("/media/stick", "rejected", bundle_id="release-4.16.3",
                       reason="InsufficientDiskSpace")  # fmt: skip


def test_a_refused_import_keeps_the_sets_this_boot_pinned() -> None:
    store = MemoryStore({"status": last_run(BOOT)})
    Reporter(line=RecordingLine(), store=store, boot_id=BOOT).bundle_report(REFUSED)
    doc = store.docs["status"]
    assert doc["pinnedImageSets"] == [{"name": "release-4.16.1", "state": "Pinned"}]
    assert doc["conditions"] == [{"type": "Pinned", "status": "True"}]
    assert doc["updatedAt"] == "2026-11-28T10:00:00Z"  # when the sets were last judged
    assert [b["bundleId"] for b in doc["bundles"]] == ["release-4.16.3"]  # this run's only


def test_a_status_of_another_boot_or_none_claims_nothing() -> None:
    for docs in ({"status": last_run(OTHER_BOOT)}, {}):
        store = MemoryStore(docs)
        Reporter(line=RecordingLine(), store=store, boot_id=BOOT).bundle_report(REFUSED)
        assert store.docs["status"]["pinnedImageSets"] == []
    store = MemoryStore({"status": last_run(BOOT)})
    Reporter(line=RecordingLine(), store=store).bundle_report(REFUSED)  # boot not known
    assert store.docs["status"]["pinnedImageSets"] == []
