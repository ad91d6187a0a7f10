"""The pure parts of bench.release_scale: the release's plan, the fit, the goals table."""

from __future__ import annotations

from typing import Any

import pytest

from bench.release_scale import fanout_size, fanouts, parse_args
from bench.scale_measure import GIB, fit
from bench.scale_release import IMAGES, MIN_LAYER_BYTES, describe, plan_release
from bench.scale_report import goals, summarize


def test_the_plan_keeps_its_shape_at_every_size_and_scales_its_bytes() -> None:
    small, large = plan_release(GIB // 20, 31), plan_release(6 * GIB, 31)
    assert len(small) == len(large) == IMAGES
    assert [len(p.layers) for p in small] == [len(p.layers) for p in large]
    big = describe(large)
    assert big["unique_layers"] == describe(small)["unique_layers"]
    assert abs(big["layer_bytes"] - 6 * GIB) < GIB / 1000  # unique bytes sum to the size
    assert big["shared_layers"] >= 3  # the base layers
    assert describe(small)["layer_bytes_p10_p50_p90_max"][0] >= MIN_LAYER_BYTES
    # at 16 GiB: a few layers near 1 GB, most in 10-300 MB
    full = describe(plan_release(16 * GIB, 31))["layer_bytes_p10_p50_p90_max"]
    assert full[3] == GIB and 5e6 < full[1] < 300e6


def test_the_plan_is_a_function_of_its_seed() -> None:
    assert plan_release(GIB, 31) == plan_release(GIB, 31)
    assert plan_release(GIB, 31) != plan_release(GIB, 32)


def test_the_fit_finds_slope_and_intercept_and_says_how_far_from_proportional() -> None:
    found = fit([(1.0, 12.0), (3.0, 32.0)])  # 10 s/GiB + 2 s
    assert found is not None
    assert found.slope_per_gib == pytest.approx(10.0)
    assert found.intercept == pytest.approx(2.0)
    assert found.at_full == pytest.approx(162.0)
    assert found.proportional_miss == pytest.approx(abs(12 - 32 / 3) / 12)
    assert fit([(2.0, 1.0)]) is None  # one size: nothing to fit
    three = fit([(1.0, 10.0), (2.0, 25.0), (3.0, 30.0)])
    assert three is not None and three.max_residual > 0.05


def side(seconds: float, rss: float = 50.0, disk: int = 0) -> dict[str, Any]:
    return {"what": "x", "seconds": seconds, "rss_mib": {"nodeagent bundle import": rss,
            "crio": 900.0}, "disk_bytes": disk}  # fmt: skip


def step(name: str, seconds: float, base: float | None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "nodeagent": side(seconds, disk=extra.pop("disk", 0)),
            "baseline": None if base is None else side(base), "extra": extra}  # fmt: skip


def sizes() -> list[dict[str, Any]]:
    def one(gib: float, scale: float) -> dict[str, Any]:
        return {"bundle_bytes": int(gib * GIB), "steps": [
            step("import", 10 * scale, 8 * scale, disk=int(2.2 * gib * GIB),
                 store_bytes=int(gib * GIB), unpacked_bytes=int(gib * GIB)),
            step("verify", 1.0 * scale, 1.0 * scale),
            step("copy", 2 * scale, 1 * scale, device_bytes_over_bundle=1.0),
            step("refused", 3.0, None, store_bytes_left=5, crio_storage_bytes_left=0),
        ]}  # fmt: skip

    return [one(1.0, 1.0), one(3.0, 3.0)]


def test_the_goals_are_ratios_of_measured_figures_with_a_verdict() -> None:
    rows = {row["goal"]: row for row in goals(sizes())}
    imported = rows["import / skopeo (N at once)"]
    assert imported["measured"] == pytest.approx(1.25) and imported["measured_result"] == "MISS"
    assert imported["at_16gib"] == pytest.approx(1.25)
    assert rows["store verify / openssl"]["measured_result"] == "PASS"
    assert rows["stick copy / raw read"]["measured"] == pytest.approx(2.0)
    # disk: 2.2 x size against (store + unpacked) = 2 x size: 1.1 > 1.05
    assert rows["import: disk at the peak / (store + unpacked)"]["measured_result"] == "MISS"
    # only nodeagent's processes count against the 256 MiB (CRI-O's 900 is not its)
    assert rows["import: nodeagent peak RSS MiB"]["measured"] == 50.0
    assert rows["refused import: bytes left in store + CRI-O"]["measured_result"] == "MISS"
    fits = summarize(sizes())["fits"]
    assert fits["import"]["seconds"]["slope_per_gib"] == pytest.approx(10.0)


def fanout_figures(nodes: int, rate_mbit: float, ratio: float, rss: float) -> dict[str, Any]:
    judged = rate_mbit == 100
    verdict = ("PASS" if ratio <= 1.15 else "MISS") if judged else None
    return {"figures": {"nodes": nodes, "rate_mbit": rate_mbit, "ratio": ratio,
                        "ratio_goal": 1.15, "ratio_verdict": verdict, "peak_rss_mib": rss,
                        "rss_goal_mib": 256.0}}  # fmt: skip


def test_the_fan_out_is_a_goal_at_100_mbit_and_information_at_other_rates() -> None:
    measured = sizes()
    measured[0]["steps"] += [
        step("fanout", 300.0, None, **fanout_figures(4, 100, 1.28, 120.0)),
        step("fanout", 90.0, None, **fanout_figures(4, 1000, 6.5, 130.0)),
    ]
    rows = {row["goal"]: row for row in goals(measured)}
    at_100 = rows["fan-out, 4 nodes at 100 Mbit/s: T_all / (S/R)"]
    assert (at_100["measured"], at_100["measured_result"]) == (1.28, "MISS")
    assert rows["fan-out, 4 nodes at 1000 Mbit/s: T_all / (S/R)"]["measured_result"] is None
    assert rows["fan-out, 4 nodes: a daemon's peak RSS MiB"]["measured_result"] == "PASS"


def test_the_default_run_fans_out_at_one_size_and_quick_not_at_all() -> None:
    full = parse_args([])
    assert (full.sizes, full.fanout_nodes) == ([2.0, 6.0], [4, 8])
    assert {"fanout", "prepull"} <= set(full.steps) and fanout_size(full) == 2.0
    assert full.throttle_mbps == 100.0  # the copy at a stick's rate too
    quick = parse_args(["--quick"])
    assert quick.sizes == [2.0] and not {"fanout", "prepull"} & set(quick.steps)
    assert quick.throttle_mbps == 0.0
    eight = parse_args(["--fanout-nodes", "8", "--fanout-gb", "6"])
    assert (eight.fanout_nodes, fanout_size(eight)) == ([8], 6.0)
    assert fanouts(full) == [(4, 100), (8, 100)]
    fast = parse_args(["--fanout-rates", "100,1000"])
    assert fanouts(fast) == [(4, 100), (8, 100), (4, 1000)]


def test_the_pre_pull_over_a_far_link_is_two_goals() -> None:
    measured = sizes()
    figures = {"over_floor": 2.25, "over_serial": 0.14}
    measured[1]["steps"].append(step("prepull", 11.0, 78.0, figures=figures))
    rows = {row["goal"]: row for row in goals(measured)}
    assert rows["pre-pull over the 50 ms link: nodeagent / CPU floor"]["measured_result"] == "MISS"
    assert rows["pre-pull over the 50 ms link: nodeagent / serial"]["measured_result"] == "PASS"
    assert "prepull: nodeagent peak RSS MiB" not in rows  # measured by bench/prepull itself
