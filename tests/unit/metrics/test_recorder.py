"""The recorder's figures, its label caps, and the exposition prometheus_client makes of them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from nodeagent.adapters.metrics import SnapshotCollector
from nodeagent.metrics import NO_METRICS
from nodeagent.metrics.recorder import Recorder
from nodeagent.metrics.series import (
    MAX_REASON_LABELS,
    MAX_SET_LABELS,
    OTHER_REASON,
    OTHER_SETS,
    Histogram,
    Transfer,
    Work,
)
from nodeagent.status import BundleReport, Condition, ImageFailure, SetStatus


def set_status(name: str, *, total: int = 3, pinned: int = 2, failed: int = 1) -> SetStatus:
    return SetStatus(
        name=name,
        source=f"/etc/nodeagent/sets/{name}.yaml",
        is_persistent=True,
        state="Degraded",
        desired_generation=7,
        current_generation=6,
        last_failed_generation=None,
        last_failed_error=None,
        images_total=total,
        images_present=pinned,
        images_pinned=pinned,
        failures=tuple(
            ImageFailure(f"r.io/{name}/{i}", "ImageNotFound", "") for i in range(failed)
        ),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def samples(recorder: Recorder) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(recorder))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_sets_are_exported_per_set_only_once_a_sync_reported_them() -> None:
    recorder = Recorder(wall_clock=lambda: 1_700_000_000.0)
    assert not any(name.startswith("nodeagent_set_") for name, _ in samples(recorder))
    recorder.sets_reported([set_status("b"), set_status("a", total=5, pinned=5, failed=0)],
                           is_final=True)  # fmt: skip
    got = samples(recorder)
    assert got[("nodeagent_set_images_wanted", (("set", "a"),))] == 5
    assert got[("nodeagent_set_images_pinned", (("set", "b"),))] == 2
    assert got[("nodeagent_set_images_failed", (("set", "b"),))] == 1
    assert got[("nodeagent_set_generation", (("set", "a"),))] == 7
    assert got[("nodeagent_last_sync_timestamp_seconds", ())] == 1_700_000_000.0


def test_an_interim_report_moves_the_sets_but_not_the_last_sync_time() -> None:
    clock = Clock()
    recorder = Recorder(wall_clock=clock)
    recorder.sets_reported([set_status("a")], is_final=False)
    assert recorder.snapshot().last_sync_unix_s is None
    assert recorder.snapshot().sets[0].pinned == 2


def test_sets_beyond_the_cap_are_summed_under_other_without_a_generation() -> None:
    recorder = Recorder()
    sets = [set_status(f"set-{i:03d}", total=2, pinned=1, failed=1) for i in range(70)]
    recorder.sets_reported(sets, is_final=True)
    rows = recorder.snapshot().sets
    assert len(rows) == MAX_SET_LABELS + 1
    assert [r.name for r in rows[:2]] == ["set-000", "set-001"]
    other = rows[-1]
    assert (other.name, other.wanted, other.pinned, other.failed) == (OTHER_SETS, 12, 6, 6)
    got = samples(recorder)
    assert got[("nodeagent_set_images_wanted", (("set", OTHER_SETS),))] == 12
    assert ("nodeagent_set_generation", (("set", OTHER_SETS),)) not in got
    assert not any(dict(labels).get("set") == "set-069" for _, labels in got)


def test_pulled_bytes_count_each_new_blob_once_and_only_for_pulled_images() -> None:
    recorder = Recorder()
    shared = ("sha256:shared", 1000)
    recorder.pulls_sized({
        "r.io/a@sha256:1": (("sha256:cfg-a", 10), shared, ("sha256:a", 500)),
        "r.io/b@sha256:2": (("sha256:cfg-b", 20), shared),
        "r.io/c@sha256:3": (("sha256:cfg-c", 30), ("sha256:c", 4000)),
    })  # fmt: skip
    recorder.pull_ended("r.io/a@sha256:1", is_pulled=True, seconds=3.0)
    recorder.pull_ended("r.io/b@sha256:2", is_pulled=True, seconds=70.0)
    recorder.pull_ended("r.io/c@sha256:3", is_pulled=False, seconds=400.0)
    recorder.pull_ended("r.io/unsized@sha256:4", is_pulled=True, seconds=None)
    now = recorder.snapshot()
    assert now.transferred_bytes[Transfer.PULLED] == 10 + 1000 + 500 + 20
    pulls = now.durations[Work.PULL]
    assert pulls.count == 3
    assert pulls.total == 473.0
    got = samples(recorder)
    assert got[("nodeagent_pull_duration_seconds_bucket", (("le", "5.0"),))] == 1
    assert got[("nodeagent_pull_duration_seconds_bucket", (("le", "120.0"),))] == 2
    assert got[("nodeagent_pull_duration_seconds_bucket", (("le", "+Inf"),))] == 3
    assert got[("nodeagent_pull_duration_seconds_count", ())] == 3
    assert got[("nodeagent_transferred_bytes_total", (("kind", "pulled"),))] == 1530
    assert got[("nodeagent_transferred_bytes_total", (("kind", "fetched"),))] == 0


def test_histogram_buckets_are_inclusive_upper_bounds() -> None:
    observed = Histogram().observe(1.0).observe(1.5).observe(9999.0)
    cumulative = dict(observed.cumulative())
    assert (cumulative["1.0"], cumulative["5.0"], cumulative["3600.0"]) == (1, 2, 2)
    assert cumulative["+Inf"] == 3


def test_admission_counts_each_decision_and_keeps_the_refused_sets_of_the_last() -> None:
    recorder = Recorder()
    assert recorder.snapshot().refused_sets is None  # unknown, not 0
    recorder.admission_decided(["a", "b"], ["c"], ["d"])
    assert recorder.snapshot().refused_sets == 1  # refused for space; "d" is held, not refused
    recorder.admission_decided(["a", "b", "c"], [], [])
    now = recorder.snapshot()
    assert now.admissions == {
        ("admitted", "Admitted"): 5,
        ("refused", "InsufficientDiskSpace"): 1,
        ("held", "SizeUnknown"): 1,
    }
    assert now.refused_sets == 0  # the last admission refused none
    got = samples(recorder)
    assert got[("nodeagent_disk_refused_sets", ())] == 0
    key = (("decision", "refused"), ("reason", "InsufficientDiskSpace"))
    assert got[("nodeagent_disk_admission_decisions_total", key)] == 1


def test_bundles_count_outcomes_by_reason_and_time_imports_from_detection() -> None:
    clock = Clock()
    recorder = Recorder(monotonic=clock)
    stick = BundleReport("/dev/sdb1", "detected", bundle_id="b1", bytes_total=9000)
    recorder.bundle_reported(stick)
    clock.now += 42.0
    recorder.bundle_reported(replace(stick, state="importing"))
    recorder.bundle_reported(replace(stick, state="imported"))
    recorder.bundle_reported(BundleReport("/dev/sdc1", "detected"))
    recorder.bundle_reported(
        BundleReport("/dev/sdc1", "rejected", reason="BundleSignedByUnknownKey")
    )
    now = recorder.snapshot()
    assert now.bundles == {("imported", "Imported"): 1, ("rejected", "BundleSignedByUnknownKey"): 1}
    assert now.transferred_bytes[Transfer.IMPORTED] == 9000
    assert now.durations[Work.IMPORT].total == 42.0
    assert now.durations[Work.IMPORT].count == 1


def test_reasons_past_the_cap_are_folded_into_other_and_counted() -> None:
    recorder = Recorder()
    for i in range(MAX_REASON_LABELS + 5):
        recorder.bundle_reported(BundleReport(f"s{i}", "rejected", reason=f"Reason{i}"))
    now = recorder.snapshot()
    assert len(now.bundles) == MAX_REASON_LABELS + 1
    assert now.bundles[("rejected", OTHER_REASON)] == 5
    assert now.labels_dropped == 5
    assert samples(recorder)[("nodeagent_metrics_labels_folded_total", ())] == 5


def test_offline_readiness_is_absent_until_the_drill_ran() -> None:
    recorder = Recorder()
    got = samples(recorder)
    assert got[("nodeagent_offline_ready_known", ())] == 0
    assert ("nodeagent_offline_ready", ()) not in got
    recorder.offline_checked(Condition("OfflineReady", False, "PodPullsAlways", "x"))
    got = samples(recorder)
    assert (got[("nodeagent_offline_ready_known", ())], got[("nodeagent_offline_ready", ())]) == (
        1,
        0,
    )


def test_store_size_restores_peers_and_damage() -> None:
    recorder = Recorder()
    assert ("nodeagent_store_size_bytes", ()) not in samples(recorder)
    recorder.store_measured(123_456)
    recorder.restore_ended(seconds=12.0)
    recorder.transferred(Transfer.RESTORED, 700)
    recorder.transferred(Transfer.SERVED, 0)
    recorder.transferred(Transfer.FETCHED, 300)
    recorder.store_damaged("StoreBlobCorrupt")
    recorder.store_damaged("StoreBlobCorrupt")
    got = samples(recorder)
    assert got[("nodeagent_store_size_bytes", ())] == 123_456
    assert got[("nodeagent_restore_duration_seconds_count", ())] == 1
    assert got[("nodeagent_transferred_bytes_total", (("kind", "restored"),))] == 700
    assert got[("nodeagent_transferred_bytes_total", (("kind", "served"),))] == 0
    assert got[("nodeagent_transferred_bytes_total", (("kind", "fetched"),))] == 300
    assert got[("nodeagent_store_damaged_total", (("reason", "StoreBlobCorrupt"),))] == 2


def test_openmetrics_exposition_ends_with_eof_and_counters_carry_total() -> None:
    recorder = Recorder()
    recorder.transferred(Transfer.SERVED, 5)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(recorder))
    text = generate_openmetrics(registry).decode()  # type: ignore[no-untyped-call]
    assert text.endswith("# EOF\n")
    assert 'nodeagent_transferred_bytes_total{kind="served"} 5.0' in text


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.sets_reported([set_status("a")], is_final=True),
        lambda m: m.pull_ended("r", is_pulled=True, seconds=1.0),
        lambda m: m.admission_decided(["a"], [], []),
        lambda m: m.transferred(Transfer.PULLED, 1),
    ],
)
def test_no_metrics_takes_every_report_and_keeps_nothing(call: object) -> None:
    assert callable(call)
    assert call(NO_METRICS) is None
    assert not hasattr(NO_METRICS, "snapshot")
