"""The site view: every Node in scope judged from its NodeImageStatus (or its absence)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from nodeagent.cluster.holdings import HeldBundle, holdings_of
from nodeagent.cluster.site import (
    bundle_view,
    judge_node,
    nodes_in_scope,
    site_views,
    statuses_by_node,
)
from nodeagent.selectors import parse_selector

NOW = dt.datetime(2026, 11, 25, 12, 0, 0, tzinfo=dt.UTC)
STALE_S = 180.0
BUNDLE = "edge-4.18.3"


def stamp(age_s: float) -> str:
    when = NOW - dt.timedelta(seconds=age_s)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def bundle(state: str, bundle_id: str = BUNDLE, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source": "/run/media/a",
        "bundleId": bundle_id,
        "state": state,
        "images": {"total": extra.pop("total", 10), "present": 4},
    }
    return entry | extra


def nis(
    name: str,
    *bundles: dict[str, Any],
    sets: list[dict[str, Any]] | None = None,
    age_s: float = 10.0,
) -> dict[str, Any]:
    return {
        "apiVersion": "nodeagent.io/v1alpha1",
        "kind": "NodeImageStatus",
        "metadata": {"name": name},
        "status": {
            "nodeName": name,
            "lastHeartbeatTime": stamp(age_s),
            "bundles": list(bundles),
            "pinnedImageSets": sets or [],
        },
    }


def view(nodes: list[str], *statuses: dict[str, Any], set_name: str | None = None) -> Any:
    return bundle_view(
        nodes,
        statuses_by_node(statuses),
        BUNDLE,
        set_name,
        now=NOW,
        stale_after_s=STALE_S,
    )


def test_a_node_without_status_is_a_laggard_never_skipped() -> None:
    result = view(["a", "b"], nis("a", bundle("pinned")))
    assert not result.is_complete
    assert [(n.node, n.verdict) for n in result.laggards] == [("b", "no-status")]
    assert "no status" in result.lines()[1]
    assert result.summary().startswith(f"bundle {BUNDLE}: 1/2 nodes pinned")


def test_every_node_pinned_is_complete() -> None:
    result = view(["a", "b"], nis("a", bundle("pinned")), nis("b", bundle("pinned", age_s=9999)))
    assert result.is_complete
    assert [n.node for n in result.pinned] == ["a", "b"]


def test_an_empty_scope_never_completes() -> None:
    assert not view([], nis("a", bundle("pinned"))).is_complete


@pytest.mark.parametrize(
    ("entry", "verdict", "is_holding"),
    [
        (bundle("stored"), "holding", True),
        (bundle("imported"), "holding", True),
        (bundle("importing"), "progressing", True),
        (bundle("storing"), "progressing", False),
        (bundle("fetching"), "progressing", False),
        (bundle("verified"), "progressing", False),
        (bundle("pinned", bundle_id="other"), "absent", False),
    ],
)
def test_states_short_of_pinned(entry: dict[str, Any], verdict: str, is_holding: bool) -> None:
    (report,) = view(["a"], nis("a", entry)).nodes
    assert (report.verdict, report.is_holding) == (verdict, is_holding)


def test_failing_nodes_carry_reason_and_message() -> None:
    entry = bundle("rejected", reason="BundleSignatureInvalid", message="signed by nobody")
    result = view(["a", "b"], nis("a", entry), nis("b", bundle("interrupted")))
    assert [(n.node, n.reason) for n in result.failing] == [
        ("a", "BundleSignatureInvalid"),
        ("b", "interrupted"),
    ]
    assert "failing: BundleSignatureInvalid: signed by nobody" in result.lines()[1]


def test_the_furthest_entry_for_the_id_speaks_for_the_node() -> None:
    status = nis("a", bundle("pinned"), bundle("rejected", reason="BundleMediaRemoved"))
    assert view(["a"], status).is_complete


def test_bytes_left_from_progress_and_unknown_never_zero() -> None:
    moving = bundle("importing", progress={"doneBytes": 300, "totalBytes": 1000})
    silent = bundle("storing")
    result = view(["a", "b"], nis("a", moving), nis("b", silent))
    assert [n.bytes_left for n in result.nodes] == [700, None]
    assert result.bytes_left() == (700, 1)
    assert "700 B left" in result.lines()[1]
    assert "(1 nodes not reporting bytes)" in result.summary()


def test_a_node_fetching_from_its_peers_reports_its_bytes_left() -> None:
    fetching = bundle("fetching", progress={"doneBytes": 1 << 20, "totalBytes": 3 << 20})
    (report,) = view(["a"], nis("a", fetching)).nodes
    assert (report.verdict, report.bytes_left) == ("progressing", 2 << 20)


def test_a_node_in_progress_without_heartbeat_is_stale() -> None:
    result = view(
        ["a", "b", "c"],
        nis("a", bundle("importing"), age_s=STALE_S + 1),
        nis("b", bundle("importing"), age_s=STALE_S - 1),
        nis("c", bundle("imported"), age_s=STALE_S * 10),
    )
    assert [n.verdict for n in result.nodes] == ["stale", "progressing", "holding"]
    assert result.nodes[0].reason == "HeartbeatStale"
    assert "181 s ago" in result.nodes[0].message


def test_a_status_with_no_heartbeat_in_progress_is_stale() -> None:
    status = nis("a", bundle("importing"))
    del status["status"]["lastHeartbeatTime"]
    assert judge_node("a", status, BUNDLE, None, now=NOW, stale_after_s=STALE_S).verdict == "stale"


def test_an_object_without_status_is_unreadable_not_pinned() -> None:
    report = judge_node("a", {"metadata": {"name": "a"}}, BUNDLE, None, now=NOW, stale_after_s=1)
    assert report.verdict == "unreadable"


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", ["edge-1", "edge-2", "master-1"]),
        ("role=edge", ["edge-1", "edge-2"]),
        ("role=edge,zone in (b)", ["edge-2"]),
        ("!role", []),
        ("role notin (edge)", ["master-1"]),
    ],
)
def test_selector_decides_the_scope(selector: str, expected: list[str]) -> None:
    nodes = [
        node("edge-1", role="edge", zone="a"),
        node("edge-2", role="edge", zone="b"),
        node("master-1", role="master"),
    ]
    assert nodes_in_scope(nodes, parse_selector(selector)) == expected


def pinned_set(name: str, state: str, current: int | None, desired: int, **extra: Any) -> Any:
    doc: dict[str, Any] = {
        "name": name,
        "state": state,
        "desiredGeneration": desired,
        "images": {"total": 5, "present": 5, "pinned": 3, "failed": 0},
        "bytes": {"present": 10, "toPull": 2048},
    }
    if current is not None:
        doc["currentGeneration"] = current
    return doc | extra


def test_with_a_set_its_generation_decides() -> None:
    failed = pinned_set(
        "up",
        "Degraded",
        1,
        2,
        reason="ImageNotFound",
        failedImages=[{"image": "r/x@sha256:1", "reason": "ImageNotFound", "message": "gone"}],
    )
    result = view(
        ["a", "b", "c", "d", "e"],
        nis("a", bundle("pinned"), sets=[pinned_set("up", "Pinned", 2, 2)]),
        nis("b", bundle("pinned"), sets=[pinned_set("up", "Pinned", 1, 2)]),
        nis("c", bundle("pinned"), sets=[failed]),
        nis("d", bundle("pinned"), sets=[pinned_set("other", "Pinned", 1, 1)]),
        nis("e", bundle("rejected", reason="BundleDigestMismatch"), sets=[]),
        set_name="up",
    )
    verdicts = {n.node: (n.verdict, n.reason) for n in result.nodes}
    assert verdicts == {
        "a": ("pinned", ""),
        "b": ("progressing", ""),
        "c": ("failing", "ImageNotFound"),
        "d": ("absent", ""),
        "e": ("failing", "BundleDigestMismatch"),
    }
    b = result.nodes[1]
    assert b.bytes_left == 2048
    assert "generation 1/2" in b.why()
    assert result.summary().startswith(f"bundle {BUNDLE} set up: 1/5 nodes pinned")


def test_different_image_counts_for_one_id_are_conflicts() -> None:
    result = view(
        ["a", "b", "c", "d"],
        nis("a", bundle("pinned", total=10)),
        nis("b", bundle("pinned", total=10)),
        nis("c", bundle("stored", total=12)),
        nis("d", bundle("detected", total=99)),  # not verified yet: not compared
    )
    assert [(c.node, c.images_total, c.expected_total) for c in result.conflicts] == [("c", 12, 10)]
    assert any("different manifest" in line for line in result.lines())


def test_hostile_text_is_clipped_and_escaped() -> None:
    evil = "\x1b]0;owned\x07\x1b[2J" + "A" * 5000
    entry = bundle("rejected", bundle_id=evil, reason=evil, message=evil)
    statuses = statuses_by_node([nis("a\x1b[31m", entry)])
    scope = nodes_in_scope([node("a\x1b[31m")], parse_selector(""))
    (result,) = site_views(scope, statuses, now=NOW, stale_after_s=STALE_S)
    text = "\n".join(result.lines()) + str(result.to_json())
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b" in text
    assert len(text) < 4000


def test_site_views_one_per_bundle_id_seen_in_scope() -> None:
    statuses = statuses_by_node(
        [
            nis("a", bundle("pinned"), bundle("stored", bundle_id="next")),
            nis("z", bundle("pinned", bundle_id="outside")),
        ]
    )
    views = site_views(["a", "b"], statuses, now=NOW, stale_after_s=STALE_S)
    assert [(v.bundle_id, len(v.pinned), len(v.holding)) for v in views] == [
        (BUNDLE, 1, 1),
        ("next", 0, 1),
    ]


@pytest.mark.parametrize(
    ("body", "verdict"),
    [
        ({"bundles": "x"}, "absent"),
        ({"bundles": [None, 3, {"bundleId": BUNDLE, "state": 7, "images": []}]}, "stale"),
        (
            {
                "bundles": [
                    {"bundleId": BUNDLE, "state": "importing", "progress": {"doneBytes": -1}}
                ]
            },
            "stale",
        ),
        (
            {
                "lastHeartbeatTime": "yesterday",
                "bundles": [{"bundleId": BUNDLE, "state": "pinned"}],
            },
            "pinned",
        ),
    ],
)
def test_malformed_statuses_never_crash_nor_pin_by_accident(
    body: dict[str, Any], verdict: str
) -> None:
    status = {"metadata": {"name": "a"}, "status": body}
    report = judge_node("a", status, BUNDLE, None, now=NOW, stale_after_s=STALE_S)
    assert report.verdict == verdict
    assert report.why()


def test_a_set_reporting_zero_bytes_to_pull_has_unknown_bytes_left() -> None:
    unknown = pinned_set("up", "Progressing", None, 1, bytes={"present": 0, "toPull": 0})
    (report,) = view(["a"], nis("a", bundle("pinned"), sets=[unknown]), set_name="up").nodes
    assert (report.verdict, report.bytes_left) == ("progressing", None)


# ---------------------------------------------------------------- with published holdings

D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def held(name: str, digest: str = D1, *, complete: bool = True, bundle_id: str = BUNDLE) -> Any:
    entry = HeldBundle(bundle_id, digest, complete, 3, 300)
    return holdings_of(name, [entry], is_serving=True, address="10.0.0.1:9447")


def test_holdings_name_who_holds_and_who_fetches_and_count_as_holding() -> None:
    statuses = statuses_by_node([nis("a", bundle("pinned")), nis("b", bundle("storing"))])
    holdings = {"a": held("a"), "b": held("b", complete=False), "c": held("c")}
    result = bundle_view(
        ["a", "b", "c"], statuses, BUNDLE, now=NOW, stale_after_s=STALE_S, holdings=holdings
    )
    assert [n.node for n in result.holding] == ["a", "c"]  # c: no status, but holds it
    assert "  held by: a, c" in result.lines()
    assert "  being fetched by: b" in result.lines()
    assert result.to_json()["holders"][1] == {"node": "b", "manifestDigest": D1, "complete": False}


def test_another_manifest_under_the_id_is_named_exactly_and_keeps_the_gate_closed() -> None:
    statuses = statuses_by_node([nis(n, bundle("pinned", total=10)) for n in "abc"])
    holdings = {"a": held("a"), "b": held("b"), "c": held("c", D2)}
    result = bundle_view(
        ["a", "b", "c"], statuses, BUNDLE, now=NOW, stale_after_s=STALE_S, holdings=holdings
    )
    assert not result.laggards
    assert not result.is_complete
    assert [(c.node, c.manifest_digest, c.expected_digest) for c in result.digest_conflicts] == [
        ("c", D2, D1)
    ]
    assert f"  c: holds manifest {D2} under this id where most nodes hold {D1}: a different " \
        "manifest under the same id" in result.lines()  # fmt: skip
    same = {"a": held("a"), "b": held("b"), "c": held("c")}
    assert bundle_view(
        ["a", "b", "c"], statuses, BUNDLE, now=NOW, stale_after_s=STALE_S, holdings=same
    ).is_complete


def test_the_image_count_hint_is_only_for_nodes_without_holdings() -> None:
    statuses = statuses_by_node(
        [nis("a", bundle("pinned", total=10)), nis("b", bundle("pinned", total=10)),
         nis("c", bundle("pinned", total=12))]
    )  # fmt: skip
    with_c = {"c": held("c")}
    result = bundle_view(
        ["a", "b", "c"], statuses, BUNDLE, now=NOW, stale_after_s=STALE_S, holdings=with_c
    )
    assert result.conflicts == ()  # c's digest is known: no guessing from its count
    without = bundle_view(["a", "b", "c"], statuses, BUNDLE, now=NOW, stale_after_s=STALE_S)
    assert [c.node for c in without.conflicts] == ["c"]


def test_site_views_include_bundles_only_the_holdings_name() -> None:
    holdings = {"a": held("a", bundle_id="fetched-only"), "z": held("z", bundle_id="outside")}
    views = site_views(["a"], {}, now=NOW, stale_after_s=STALE_S, holdings=holdings)
    assert [v.bundle_id for v in views] == ["fetched-only"]


def test_release_notes_name_the_node_and_both_versions_clipped() -> None:
    from nodeagent.cluster.site import release_notes

    status = {
        "status": {
            "releases": [
                {"digest": "sha256:" + "a" * 64, "version": "4.16.5", "set": "r", "pinned": True},
                {"digest": "sha256:" + "b" * 64, "version": "4.17.2", "set": "s", "pinned": True,
                 "reason": "ReleaseNotAnUpgrade",
                 "message": "release 4.17.2 does not upgrade from 4.16.3\x1b[2J"},
            ]
        }
    }  # fmt: skip
    notes = release_notes(["edge-1", "edge-2"], {"edge-1": status, "edge-2": {"status": "odd"}})
    assert [(n["node"], n["version"], n["reason"]) for n in notes] == [
        ("edge-1", "4.17.2", "ReleaseNotAnUpgrade")
    ]
    assert notes[0]["message"].isprintable()
