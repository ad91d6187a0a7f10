"""The reporter carries the node's OS image into every status it publishes (file and cluster)."""

from __future__ import annotations

from pathlib import Path

from nodeagent.adapters.files import JsonStateStore
from nodeagent.nodeos import BootedImage, OsImage
from nodeagent.reporting import Reporter
from nodeagent.status import NodeStatus, conditions_for
from tests.fakes.ports import RecordingLine
from tests.unit.offline.test_reporting import Cluster

DIGEST = "sha256:" + "1" * 64


def test_the_os_image_joins_every_status_once_read(tmp_path: Path) -> None:
    cluster = Cluster()
    store = JsonStateStore(tmp_path)
    reporter = Reporter(line=RecordingLine(), store=store, cluster=cluster)
    image = OsImage("rhcos", "4.18", "418.94", booted=BootedImage("rpm-ostree", "q.io/os", DIGEST))
    reporter.os_image_read(image)  # before any sync: nothing published yet
    assert cluster.updates == []
    reporter.sync_finished(NodeStatus(sets=(), conditions=conditions_for((), 0, None)))
    assert cluster.updates[-1].os_image == image
    count = len(cluster.updates)
    reporter.os_image_read(image)
    assert len(cluster.updates) == count  # unchanged: not republished
    newer = OsImage("rhcos", "4.19", "419.96")
    reporter.os_image_read(newer)
    assert cluster.updates[-1].os_image == newer
    doc = store.load("status")
    assert doc is not None
    assert doc["osImage"] == {"id": "rhcos", "versionId": "4.19", "version": "419.96"}
