"""bench.release_scale at a tiny size: the generator, the bundle and two steps, measured.

A smoke test of the benchmark, not of its figures: 0.05 GiB (180 multi-arch payload images
of small layers, cached under ~/.cache/nodeagent-testenv/release-scale), pushed into the
loopback registry, ``bundle create --release``, the stick as a read-only ext4 loop device,
the stick-to-store copy against a raw read and ``store verify`` against openssl. Loop
devices: run it under /work/helpers/e2e.lock like the other stick tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.release_scale import bench, parse_args
from bench.scale_report import render

pytestmark = [pytest.mark.integration, pytest.mark.needs("root", "skopeo")]


@pytest.mark.timeout(120)
def test_a_tiny_release_goes_through_create_copy_and_verify_with_measured_ratios(
    tmp_path: Path,
) -> None:
    opts = parse_args(["--size-gb", "0.05", "--second-gb", "0", "--steps", "copy,verify"])
    report = bench(tmp_path, opts)

    (size,) = report["sizes"]
    assert size["release"]["images"] == 180
    assert size["index_architectures"] == ["amd64", "arm64"]  # read back from the registry
    assert size["bundle_images"] == 181  # the payload and the release image
    assert size["bundle_blobs"] >= 700  # one architecture: index, manifest, config, layers
    assert 0.04 < size["bundle_bytes"] / (1 << 30) < 0.07
    steps = {step["name"]: step for step in size["steps"]}
    assert set(steps) == {"copy", "verify"}
    copy, verify = steps["copy"], steps["verify"]
    assert copy["extra"]["bytes_copied"] > 0.9 * size["bundle_bytes"]
    assert copy["extra"]["device_bytes_over_bundle"] < 1.1  # the medium read once
    assert copy["nodeagent"]["disk_bytes"] >= copy["extra"]["bytes_copied"]
    assert copy["nodeagent"]["rss_mib"]["bench.scale_steps"] > 10  # the copy's own VmHWM
    assert verify["extra"]["blobs"] == size["bundle_blobs"]
    assert verify["nodeagent"]["rss_mib"]["nodeagent store verify"] > 10

    goals = {row["goal"]: row for row in report["summary"]["goals"]}
    ratio = copy["nodeagent"]["seconds"] / copy["baseline"]["seconds"]
    assert goals["stick copy / raw read"]["measured"] == pytest.approx(ratio)
    ratio = verify["nodeagent"]["seconds"] / verify["baseline"]["seconds"]
    assert goals["store verify / openssl"]["measured"] == pytest.approx(ratio)
    assert goals["copy: nodeagent peak RSS MiB"]["measured_result"] == "PASS"
    assert goals["store verify / openssl"]["at_16gib"] is None  # one size: nothing to fit
    text = render(report)
    assert "stick copy / raw read" in text and "store verify / openssl" in text
