"""The status file's ``pulls`` while a sync pulls: kept current as pulls end, at most every
2 s (``reporting.PULL_SAVE_INTERVAL_S``), gone when the sync ends; bytes to download
unknown (None) when the sync could not size them, never 0; once sized by disk admission,
bytes done count each pulled image's blobs (a shared one once) and give a rate."""

from __future__ import annotations

from nodeagent.ports import PullEvent, PullStep
from nodeagent.reporting import PULL_SAVE_INTERVAL_S, PullTally, Reporter
from nodeagent.status import SetStatus, node_status
from tests.fakes.clock import VirtualClock
from tests.fakes.ports import MemoryStore, RecordingLine

REFS = tuple(f"r.test/app-{n}@sha256:{str(n) * 64}" for n in range(4))


def pending_set(bytes_to_pull: int) -> SetStatus:
    return SetStatus("apps", "/etc/x.yaml", True, "Progressing", 1, None, None, None, 4, 0, 0,
                     bytes_to_pull=bytes_to_pull, pending=REFS)  # fmt: skip


def started(bytes_to_pull: int) -> tuple[Reporter, MemoryStore, VirtualClock]:
    store, clock = MemoryStore(), VirtualClock()
    reporter = Reporter(line=RecordingLine(), store=store, clock=clock.monotonic,
                        tally=PullTally(wall_clock=lambda: 0.0))  # fmt: skip
    reporter.sync_started()
    reporter.sync_progress(node_status([pending_set(bytes_to_pull)], runtime=None, disk=None))
    return reporter, store, clock


def pulls(store: MemoryStore) -> object:
    doc = store.load("status")
    assert doc is not None
    return doc.get("pulls")


def test_pulls_are_written_as_they_end_at_most_every_interval() -> None:
    reporter, store, clock = started(4 << 20)
    assert pulls(store) == {
        "startedAt": "1970-01-01T00:00:00+00:00",
        "images": {"total": 4, "done": 0, "failed": 0, "inProgress": 0},
        "bytes": {"total": 4 << 20, "done": None},  # not sized: no bytes done
        "bytesPerSecond": None,
    }
    saves = len(store.saves)
    reporter.pull_event(PullEvent(PullStep.PULLED, REFS[0], 1, seconds=1.0))
    assert len(store.saves) == saves  # within the interval: not yet
    clock.now_s += PULL_SAVE_INTERVAL_S
    reporter.pull_event(PullEvent(PullStep.STARTED, REFS[2], 1))  # a start: no write
    assert len(store.saves) == saves
    reporter.pull_event(PullEvent(PullStep.FAILED, REFS[1], 3, reason="ImageNotFound", error="x"))
    assert len(store.saves) == saves + 1
    assert pulls(store) == {
        "startedAt": "1970-01-01T00:00:00+00:00",
        "images": {"total": 4, "done": 1, "failed": 1, "inProgress": 1},
        "bytes": {"total": 4 << 20, "done": None},
        "bytesPerSecond": None,
    }
    reporter.sync_finished(node_status([pending_set(0)], runtime=None, disk=None))
    assert pulls(store) is None


def test_bytes_to_download_unknown_is_null_not_zero() -> None:
    _reporter, store, _clock = started(0)
    assert pulls(store) == {
        "startedAt": "1970-01-01T00:00:00+00:00",
        "images": {"total": 4, "done": 0, "failed": 0, "inProgress": 0},
        "bytes": {"total": None, "done": None},
        "bytesPerSecond": None,
    }


def test_sized_pulls_count_whole_images_bytes_and_a_rate() -> None:
    wall = {"s": 100.0}
    store, clock = MemoryStore(), VirtualClock()
    tally = PullTally(wall_clock=lambda: 0.0, monotonic=lambda: wall["s"])
    reporter = Reporter(line=RecordingLine(), store=store, clock=clock.monotonic, tally=tally)
    reporter.sync_started()
    shared = ("sha256:" + "b" * 64, 3 << 20)
    reporter.pulls_sized({
        REFS[0]: (("c0", 1000), shared, ("sha256:" + "1" * 64, 1 << 20)),
        REFS[1]: (("c1", 1000), shared),
    })  # fmt: skip
    reporter.sync_progress(node_status([pending_set(9 << 20)], runtime=None, disk=None))
    first = pulls(store)
    assert isinstance(first, dict)
    assert first["bytes"] == {"total": 2000 + (4 << 20), "done": 0}  # shared blob once
    assert first["bytesPerSecond"] is None  # nothing done yet: no rate, not 0
    wall["s"] += 2.0
    clock.now_s += PULL_SAVE_INTERVAL_S
    reporter.pull_event(PullEvent(PullStep.PULLED, REFS[0], 1, seconds=2.0))
    after = pulls(store)
    assert isinstance(after, dict)
    assert after["bytes"] == {"total": 2000 + (4 << 20), "done": 1000 + (4 << 20)}
    assert after["bytesPerSecond"] == round((1000 + (4 << 20)) / 2.0, 1)
    wall["s"] += 1.0
    clock.now_s += PULL_SAVE_INTERVAL_S
    reporter.pull_event(PullEvent(PullStep.PULLED, REFS[1], 1, seconds=1.0))
    done = pulls(store)
    assert isinstance(done, dict)
    assert done["bytes"]["done"] == done["bytes"]["total"]  # the shared blob not twice


def test_the_rate_is_not_moved_by_a_wall_clock_step() -> None:
    """The wall clock stepped an hour forward, then two back, while images pull (an NTP
    step): ``startedAt`` stays the date the sync started by the clock then, and the rate is
    bytes over monotonic seconds, which the step does not move."""
    wall, steady = {"s": 1_790_000_000.0}, {"s": 50.0}
    store, clock = MemoryStore(), VirtualClock()
    tally = PullTally(wall_clock=lambda: wall["s"], monotonic=lambda: steady["s"])
    reporter = Reporter(line=RecordingLine(), store=store, clock=clock.monotonic, tally=tally)
    reporter.sync_started()
    reporter.pulls_sized({REFS[0]: (("c0", 4000),), REFS[1]: (("c1", 4000),)})
    reporter.sync_progress(node_status([pending_set(8000)], runtime=None, disk=None))
    for step_s, ref in ((3600.0, REFS[0]), (-7200.0, REFS[1])):
        wall["s"] += step_s + 2.0
        steady["s"] += 2.0
        clock.now_s += PULL_SAVE_INTERVAL_S
        reporter.pull_event(PullEvent(PullStep.PULLED, ref, 1, seconds=2.0))
        doc = pulls(store)
        assert isinstance(doc, dict)
        assert doc["startedAt"] == "2026-09-21T14:13:20+00:00"
        done = 4000 if ref == REFS[0] else 8000
        assert doc["bytes"] == {"total": 8000, "done": done}
        assert doc["bytesPerSecond"] == round(done / (steady["s"] - 50.0), 1)  # 1000.0, 2000.0
