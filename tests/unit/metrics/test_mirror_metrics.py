"""The node mirror's series: absent until the peer process reports, then its state."""

from __future__ import annotations

from nodeagent.metrics.recorder import Recorder
from nodeagent.status import MirrorStatus
from tests.unit.metrics.test_recorder import samples


def test_the_node_mirror_series_follow_its_last_report() -> None:
    recorder = Recorder()
    assert not any(name.startswith("nodeagent_node_mirror") for name, _ in samples(recorder))
    recorder.mirror_reported(MirrorStatus(True, "127.0.0.1:22626", 7, 3, 40, 1 << 20, 5, 2))
    got = samples(recorder)
    assert got[("nodeagent_node_mirror_serving", ())] == 1
    assert got[("nodeagent_node_mirror_blobs", (("content", "bundle"),))] == 7
    assert got[("nodeagent_node_mirror_blobs", (("content", "registry"),))] == 3
    assert got[("nodeagent_node_mirror_requests_total", ())] == 40
    assert got[("nodeagent_node_mirror_missing_total", ())] == 5
    assert got[("nodeagent_node_mirror_denied_total", ())] == 2
