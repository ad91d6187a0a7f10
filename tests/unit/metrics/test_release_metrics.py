"""``nodeagent_release_pinned`` and ``nodeagent_release_target`` as a scrape shows them."""

from __future__ import annotations

from nodeagent.adapters.metrics import release_families
from nodeagent.metrics.recorder import Recorder
from nodeagent.releases import ReleaseRow

OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64


def test_releases_and_targets_are_exported_bounded() -> None:
    recorder = Recorder()
    recorder.releases_reported(
        [ReleaseRow("4.16.3", OLD, "release-4.16.3", True, False)]
        + [ReleaseRow(f"4.17.{i}", NEW, "s", False, True) for i in range(30)]
    )
    recorder.release_targets({NEW: "4.16.5", **{f"sha256:{i:064x}": "" for i in range(9)}})
    pinned, targets = release_families(recorder.snapshot())
    samples: list[tuple[dict[str, str], int]] = [
        (dict(s.labels), int(s.value)) for s in pinned.samples
    ]
    assert samples[0] == ({"version": "4.16.3", "digest": OLD, "upgrade": "false"}, 1)
    assert samples[1] == ({"version": "4.17.0", "digest": NEW, "upgrade": "true"}, 0)
    assert len(samples) == 20
    assert len(targets.samples) == 4
    assert targets.name == "nodeagent_release_target"
