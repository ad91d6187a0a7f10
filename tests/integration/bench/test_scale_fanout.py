"""Smoke test of ``bench/scale_fanout.py``'s ``fanout_step`` (the fan-out step of
``bench/release_scale.py``): a small release-like bundle on an ext4 stick, two nodes at
100 Mbit/s; the step measures, checks and reports what the issue's goals need."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scale_fanout import fanout_step, make_release_bundle
from tests.testenv.bundles import ext4_media
from tests.testenv.site_net import SiteNetUnavailable

pytestmark = [pytest.mark.integration, pytest.mark.needs("root")]

SIZE = 6_000_000


@pytest.mark.timeout(120)
def test_the_fanout_step_measures_a_release_like_bundle_on_two_nodes(tmp_path: Path) -> None:
    bundle = make_release_bundle(tmp_path, SIZE, 24, seed=31_900, cache_dir=tmp_path / "cache")
    assert len(bundle.blobs) == 24
    blob_bytes = sum(bundle.blobs.values())
    with ext4_media(tmp_path, bundle.root) as stick:
        try:
            doc = fanout_step(
                stick.image,
                blob_bytes,
                nodes=2,
                rate_mbit=100,
                workdir=tmp_path,
                public_key=bundle.public_key,
            )
        except SiteNetUnavailable as exc:
            pytest.skip(str(exc))
    assert (doc["nodes"], doc["blobs"], doc["ratio_goal"]) == (2, 24, 1.15)
    assert doc["ratio"] * doc["s_over_r_s"] == pytest.approx(doc["t_all_s"], abs=0.2)
    assert doc["s_over_r_s"] == pytest.approx(blob_bytes * 8 / 100e6, abs=0.1)
    assert doc["ratio_verdict"] in ("PASS", "MISS")
    assert (doc["corrupt_blobs"], doc["partial_files"], doc["integrity_events"]) == (0, 0, 0)
    assert blob_bytes <= doc["medium_read_bytes"] < 2 * blob_bytes + (4 << 20)
    node0, node1 = doc["memory_disk"]
    runs = {p["runs"] for p in node1["processes"]}
    assert {"run", "serve-peers"} <= runs  # the daemon and its peer server, both measured
    assert 0 < node1["peak_rss_mib"] <= doc["peak_rss_mib"]
    assert node1["disk_peak_mib"] * (1 << 20) >= blob_bytes
    assert node0["disk_peak_mib"] * (1 << 20) >= blob_bytes
    fetcher = doc["profile"]["per_node"][1]
    assert fetcher["received_mb"] * 1e6 >= blob_bytes - 50_000  # rounded to 0.1 MB
    assert 0 < fetcher["first_byte_s"] <= fetcher["complete_s"] <= doc["t_all_s"] + 0.05
    assert "bundle_fetch_started" in fetcher["events_s"]
    assert not (tmp_path / "sf2").exists()  # the N stores removed
