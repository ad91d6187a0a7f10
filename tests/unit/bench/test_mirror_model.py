"""The node mirror benchmark's own pieces (bench/mirror_model.py, bench/mirror.py's choice of
blobs for the link): no processes, no network; the full run is by hand (bench/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.mirror import HeldSet
from bench.mirror_link import link_blobs
from bench.mirror_model import (
    BUDGET_MIB,
    NODE_MIRROR,
    NODE_MIRROR_AGAIN,
    PEER_SERVER,
    REGISTRY,
    Figures,
    Pull,
    Transfer,
    checks,
    pull_ratios,
    render,
    verdict,
)


def pull(source: str, round_no: int, wall_s: float) -> Pull:
    return Pull(source, round_no, wall_s, 2_000_000_000, 10.0, 2.0, 20.0, 1.5)


def test_ratios_pair_the_sources_of_each_round() -> None:
    pulls = [
        pull(NODE_MIRROR, 1, 21.0),
        pull(REGISTRY, 1, 20.0),
        pull(REGISTRY, 2, 25.0),
        pull(NODE_MIRROR, 2, 20.0),
        pull(NODE_MIRROR, 3, 9.0),  # no registry figure in round 3: no ratio
    ]
    assert pull_ratios(pulls) == pytest.approx([1.05, 0.8])
    assert pull_ratios([*pulls, pull(NODE_MIRROR_AGAIN, 2, 30.0)], NODE_MIRROR_AGAIN) == [1.2]


def test_a_pull_rate_is_bytes_over_wall_time() -> None:
    assert pull(NODE_MIRROR, 1, 20.0).mb_s == pytest.approx(100.0)
    assert pull(NODE_MIRROR, 1, 0.0).mb_s == 0.0


def test_a_transfer_share_is_of_the_link_rate() -> None:
    t = Transfer(PEER_SERVER, 1, 20.0, 237_500_000, 100.0, 1.0, 1.0)
    assert t.mbit_s == pytest.approx(95.0)
    assert t.share == pytest.approx(0.95)


@pytest.mark.parametrize(
    ("value", "goal", "at_most", "expected"),
    [
        (1.05, 1.05, True, "pass"),
        (1.06, 1.05, True, "MISS"),
        (0.9, 0.9, False, "pass"),
        (0.89, 0.9, False, "MISS"),
        (None, 0.9, False, "not measured"),
    ],
)
def test_verdicts(value: float | None, goal: float, at_most: bool, expected: str) -> None:
    assert verdict(value, goal, at_most=at_most) == expected


def test_what_was_not_measured_is_said_not_passed() -> None:
    fig = Figures(2_000_000_000, 8, 24, pulls=(pull(NODE_MIRROR, 1, 20.0),))
    results = {what.split(":")[0]: (value, result) for what, value, _, result in checks(fig)}
    assert results["pull"] == (None, "not measured")
    assert all(result == "not measured" for _, result in results.values())
    text = render(fig, ["header"])
    assert "not measured" in text and text.startswith("header")


def test_the_checks_use_medians_and_the_budget() -> None:
    transfers = tuple(
        Transfer(PEER_SERVER, i, 20.0, b, 100.0, 1.0, 1.0)
        for i, b in enumerate((225_000_000, 237_500_000, 240_000_000), 1)
    )
    fig = Figures(
        1, 1, 1,
        pulls=(pull(NODE_MIRROR, 1, 21.0), pull(NODE_MIRROR_AGAIN, 1, 19.0),
               pull(REGISTRY, 1, 20.0)),
        transfers=transfers,
        peer_idle_rss_mib=BUDGET_MIB + 1,
    )  # fmt: skip
    values = [value for _, value, _, _ in checks(fig)]
    results = [result for _, _, _, result in checks(fig)]
    assert values == pytest.approx([1.05, 0.95, 0.95, BUDGET_MIB + 1])
    assert results == ["pass", "pass", "pass", "MISS"]


def test_the_link_takes_the_largest_blobs_up_to_the_limit(tmp_path: Path) -> None:
    sizes = {"a": 50, "b": 300, "c": 120, "d": 10, "manifest": 1}
    held = HeldSet((), (), sizes, {d: "r" for d in "abcd"}, tmp_path)
    assert link_blobs(held, 200) == [("c", 120), ("a", 50), ("d", 10)]
    assert link_blobs(held, 100) == [("a", 50), ("d", 10)]
    assert link_blobs(held, 5) == [("d", 10)]  # at least one, even over the limit
