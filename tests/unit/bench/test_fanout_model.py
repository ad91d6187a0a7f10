"""The fan-out benchmark's own pieces (bench/fanout_model.py, bench/fanout.py's bundle):
tiny sizes, no network; the full run is by hand (bench/README.md)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from bench.fanout import make_bundle
from bench.fanout_model import (
    FANOUT,
    NODE0,
    SCALE_NODES,
    NodeResult,
    Run,
    Workload,
    calibrate,
    generations,
    growth,
    layer_sizes,
    predict,
    render_report,
    runs_from_json,
    shape_problems,
    summarize,
)
from bench.fanout_probe import BUNDLE_ID
from nodeagent.adapters.bundles.intake import check_for_import
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.adapters.store.holdings import StoreHoldings
from nodeagent.adapters.store.keeper import verify
from nodeagent.registries.manifests import Platform

MB = 1_000_000
GB = 1_000_000_000


@pytest.mark.parametrize(("size", "blobs"), [(GB, 32), (GB + 7, 32), (100, 3), (5, 5)])
def test_layer_sizes_share_the_size_within_a_byte(size: int, blobs: int) -> None:
    sizes = layer_sizes(size, blobs)
    assert (sum(sizes), len(sizes)) == (size, blobs)
    assert max(sizes) - min(sizes) <= 1


def test_layer_sizes_refuse_fewer_bytes_than_blobs() -> None:
    with pytest.raises(ValueError, match="cannot share"):
        layer_sizes(3, 4)


def test_the_issues_shape_is_32_blobs_or_more_the_largest_at_most_a_sixteenth() -> None:
    assert shape_problems([GB // 32] * 32) == []
    assert shape_problems([1] * 31) == ["31 blobs, fewer than 32"]
    big = [GB // 64] * 40 + [GB // 8]
    assert len(shape_problems(big)) == 1
    assert "over S/16" in shape_problems(big)[0]


@pytest.mark.parametrize(
    ("nodes", "k", "expected"),
    [(1, 2, 0), (2, 2, 1), (3, 2, 2), (8, 2, 3), (9, 2, 4), (100, 2, 7), (1000, 2, 10),
     (8, 1.25, 10)],
)  # fmt: skip
def test_generations_are_the_holders_growth_to_n(nodes: int, k: float, expected: int) -> None:
    assert generations(nodes, k) == expected
    assert k ** generations(nodes, k) >= nodes > k ** (generations(nodes, k) - 1) or nodes == 1


def test_growth_doubles_while_a_holder_can_serve_every_fetch_slot() -> None:
    assert growth(4, 4) == growth(8, 4) == 2
    assert growth(1, 4) == 1.25


def _node(index: int, first: float | None, done: float, size: int) -> NodeResult:
    return NodeResult(index, first, done, size, 1.0, 0, 0, 30.0)


def _work(size: int = GB) -> Workload:
    return Workload(size, 48, size // 32, 100.0, 4, 4)


def _modelled_run(mode: str, n: int, *, r: float, d: float, g: float, stick: float) -> Run:
    """A run whose nodes behave exactly as the model says, for a 1 GB bundle."""
    work = _work()
    if mode == FANOUT:
        t_all = stick + d + work.size_bytes / r + (generations(n, 2) - 1) * g
    else:
        t_all = stick + d + (n - 1) * work.size_bytes / r
    nodes = [_node(0, 1.0, stick, work.size_bytes)]
    nodes += [_node(i, stick + d, t_all, work.size_bytes) for i in range(1, n)]
    if mode == FANOUT:  # every node's own rate is r: start S/r before its end
        nodes = [nodes[0]] + [
            _node(i, t_all - work.size_bytes / r, t_all, work.size_bytes) for i in range(1, n)
        ]
        nodes[1] = _node(1, stick + d, stick + d + work.size_bytes / r, work.size_bytes)
    return Run(mode, n, stick, t_all, work.size_bytes, tuple(nodes), 5.0, 50.0, 0.0, 0, 0, 0, 0, 35)


def _runs(r: float = 12e6, d: float = 2.0, g: float = 9.0, stick: float = 11.0) -> list[Run]:
    return [
        _modelled_run(mode, n, r=r, d=d, g=g, stick=stick)
        for n in (2, 4, 8)
        for mode in (FANOUT, NODE0)
        if not (mode == NODE0 and n == 2)
    ]


def test_calibration_recovers_the_parameters_the_runs_were_made_with() -> None:
    cal = calibrate(_runs(r=12e6, d=2.0, g=9.0, stick=11.0), _work())
    assert cal.rate_bytes_per_s == pytest.approx(12e6)
    assert cal.notice_s == pytest.approx(2.0)
    assert cal.stick_s == pytest.approx(11.0)
    assert cal.generation_fit_s == pytest.approx(9.0)
    assert cal.node0_rate_bytes_per_s == pytest.approx(12e6)
    assert cal.generation_theory_s == pytest.approx(4 * (GB // 32) / 12e6)


def test_the_model_extrapolates_with_the_tree_depth() -> None:
    work = _work()
    cal = calibrate(_runs(r=10e6, d=1.0, g=5.0, stick=10.0), work)
    for n in SCALE_NODES:
        p = predict(cal, n, work)
        depth = math.ceil(math.log2(n)) - 1
        assert p["t_all_s"] == pytest.approx(10.0 + 1.0 + 100.0 + depth * 5.0)
        assert p["t_base_s"] == pytest.approx(10.0 + 1.0 + (n - 1) * 100.0)


def test_without_a_run_of_three_nodes_or_more_the_theoretical_generation_is_used() -> None:
    cal = calibrate([r for r in _runs() if r.nodes == 2], _work())
    assert cal.generation_fit_s is None
    assert cal.generation_s == cal.generation_theory_s


def test_checks_pass_when_the_fan_out_keeps_to_the_goals_and_miss_when_not() -> None:
    good = {c["name"]: c["result"] for c in summarize(_runs(g=4.0), _work())["checks"]}
    assert set(good.values()) == {"PASS"}
    slow = {c["name"]: c["result"] for c in summarize(_runs(g=100.0), _work())["checks"]}
    assert slow["(T_all - stick) / (S/R), N=8"] == "MISS"
    assert slow["T_all / all-from-node-0, N=8"] == "MISS"
    assert slow["idle RSS MiB, serving on"] == "PASS"


def test_the_growth_seen_names_a_tree_or_node_0s_link() -> None:
    work = _work()
    tree = _runs(r=12e6, d=2.0, g=9.0, stick=11.0)
    assert "grew as a tree" in (summarize(tree, work)["growth"] or "")
    slow = [r for r in tree if r.mode == NODE0 or r.nodes == 2]
    slow += [
        replace(r, mode=FANOUT) for r in _runs(r=12e6, d=2.0, g=9.0, stick=11.0) if r.mode == NODE0
    ]
    text = summarize(slow, work)["growth"] or ""
    assert "node 0's link" in text
    assert summarize([r for r in tree if r.nodes == 2], work)["growth"] is None


def test_the_re_served_share_counts_what_nodes_other_than_node_0_sent() -> None:
    nodes = (
        NodeResult(0, 0.1, 1.0, GB, 1.0, 3 * GB // 2, 0, 30.0),
        NodeResult(1, 2.0, 9.0, GB, 1.0, GB // 2, GB, 30.0),
        NodeResult(2, 2.0, 9.0, GB, 1.0, 0, GB, 30.0),
    )
    run = Run(FANOUT, 3, 1.0, 9.0, GB, nodes, 0.0, 0.0, 0.0, 0, 0, 0, 0, 35)
    assert run.reserved_share == pytest.approx(0.25)
    assert run.notice_s == pytest.approx(1.0)


def test_the_report_shows_each_run_its_nodes_the_model_and_the_checks() -> None:
    text = render_report(_runs(), _work(), ["header line"])
    assert text.startswith("header line\n")
    for n in (2, 4, 8):
        assert f"{FANOUT} N={n}" in text
    assert f"{NODE0} N=4" in text and f"{NODE0} N=8" in text
    model = text.split("model:")[1]
    assert all(f"\n{n:7d} " in model for n in SCALE_NODES)
    assert "T_all / all-from-node-0, N=8" in text


def test_a_saved_report_reads_back_as_the_same_runs() -> None:
    runs, work = _runs(), _work()
    doc = json.loads(json.dumps({"workload": asdict(work), "runs": [asdict(r) for r in runs]}))
    assert runs_from_json(doc) == (runs, work)


def test_the_generated_bundle_is_signed_verifies_and_fills_a_store(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 9 * 4096, 9, seed=7, cache_dir=tmp_path / "cache")
    assert len(bundle.blobs) == 9 + 2 * 3  # 9 layers in 3 images, a config and manifest each
    checked = check_for_import(bundle.root, tmp_path / "keys", Platform("linux", "amd64"))
    assert checked.manifest.bundle_id == BUNDLE_ID
    store = tmp_path / "store"
    copy_bundle(store, bundle.root, checked.manifest, tmp_path / "keys")
    held = StoreHoldings(store).scan()
    assert [(h.bundle_id, h.is_complete, h.size_bytes) for h in held] == [
        (BUNDLE_ID, True, sum(bundle.blobs.values()))
    ]
    assert verify(store).is_ok
