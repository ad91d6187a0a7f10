"""The reporter carries the drill's OfflineReady condition into every status it publishes,
and tells the drill each finished sync."""

from __future__ import annotations

from pathlib import Path

from nodeagent.adapters.files import JsonStateStore
from nodeagent.reporting import Reporter
from nodeagent.status import Condition, NodeStatus, conditions_for
from tests.fakes.ports import RecordingLine


class Cluster:
    def __init__(self) -> None:
        self.updates: list[NodeStatus] = []

    def update(self, status: NodeStatus, *, is_final: bool) -> None:
        self.updates.append(status)

    def poke(self) -> None:
        pass


def types(status: NodeStatus) -> list[str]:
    return [c.type for c in status.conditions]


def test_the_offline_condition_joins_every_published_status(tmp_path: Path) -> None:
    synced: list[int] = []
    cluster = Cluster()
    store = JsonStateStore(tmp_path)
    reporter = Reporter(
        line=RecordingLine(), store=store, cluster=cluster, on_synced=lambda: synced.append(1)
    )
    not_ready = Condition("OfflineReady", False, "PodPullsAlways", "1 finding(s)")
    reporter.offline_checked(not_ready)  # before any sync: nothing published yet
    assert cluster.updates == []
    status = NodeStatus(sets=(), conditions=conditions_for((), 0, None))
    reporter.sync_finished(status)
    assert synced == [1]
    assert types(cluster.updates[-1]) == ["Ready", "Progressing", "Degraded", "OfflineReady"]
    reporter.offline_checked(Condition("OfflineReady", True, "AllChecksPassed", "7 checks"))
    assert cluster.updates[-1].conditions[-1].is_true
    assert types(cluster.updates[-1]).count("OfflineReady") == 1
    count = len(cluster.updates)
    reporter.offline_checked(Condition("OfflineReady", True, "AllChecksPassed", "7 checks"))
    assert len(cluster.updates) == count  # unchanged: not republished
    doc = store.load("status")
    assert doc is not None
    assert doc["conditions"][-1] == {
        "type": "OfflineReady",
        "status": "True",
        "reason": "AllChecksPassed",
        "message": "7 checks",
    }
