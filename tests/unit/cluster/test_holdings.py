"""The NodeImageHoldings object: rendered from holdings, compared, and a peer's read strictly."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nodeagent.cluster.holdings import (
    MAX_LISTED_BUNDLES,
    MAX_TARGET_SELECTOR_CHARS,
    HeldBundle,
    HeldTarget,
    Holder,
    digest_conflicts,
    holders,
    holdings_object,
    holdings_of,
    is_published,
    parse_holdings,
)
from nodeagent.cluster.objects import NodeIdentity
from nodeagent.errors import PeerHoldingsInvalid

D1, D2, D3 = "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64
NODE = NodeIdentity("worker-1", "uid-1")


def bundle(
    bundle_id: str = "site-2026-11", digest: str = D1, *, complete: bool = True
) -> HeldBundle:
    return HeldBundle(bundle_id, digest, complete, 34, 1 << 30)


def published(**spec_changes: Any) -> dict[str, Any]:
    holdings = holdings_of("worker-1", [bundle()], is_serving=True, address="10.0.0.5:9447")
    body = holdings_object(NODE, holdings)
    body["spec"].update(spec_changes)
    return body


def test_the_object_is_named_after_the_node_owned_by_it_and_says_where_it_serves() -> None:
    body = published()
    assert body["metadata"] == {
        "name": "worker-1",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "worker-1", "uid": "uid-1"}
        ],
    }
    assert body["spec"] == {
        "nodeName": "worker-1",
        "serving": True,
        "address": "10.0.0.5:9447",
        "bundleCount": 1,
        "bundles": [
            {"bundleId": "site-2026-11", "manifestDigest": D1, "complete": True,
             "blobs": 34, "bytes": 1 << 30}
        ],
    }  # fmt: skip


def test_a_node_that_does_not_serve_publishes_no_address() -> None:
    holdings = holdings_of("worker-1", [], is_serving=False, address="10.0.0.5:9447")
    assert "address" not in holdings_object(NODE, holdings)["spec"]


def test_beyond_the_bound_complete_bundles_are_listed_first_and_all_are_counted() -> None:
    started = [bundle(f"a-{i:03d}", complete=False) for i in range(10)]
    complete = [bundle(f"b-{i:03d}") for i in range(MAX_LISTED_BUNDLES)]
    holdings = holdings_of("worker-1", started + complete, is_serving=False, address="")
    assert holdings.bundle_count == MAX_LISTED_BUNDLES + 10
    assert [b.bundle_id for b in holdings.bundles] == [b.bundle_id for b in complete]


def test_the_same_spec_and_owner_is_published_whatever_else_the_server_adds() -> None:
    body = published()
    observed = copy.deepcopy(body)
    observed["metadata"] |= {"resourceVersion": "42", "uid": "x", "managedFields": []}
    assert is_published(body, observed)
    assert not is_published(body, None)
    assert not is_published(published(bundleCount=2), observed)
    other_owner = copy.deepcopy(observed)
    other_owner["metadata"]["ownerReferences"][0]["uid"] = "uid-old"
    assert not is_published(body, other_owner)


def test_a_valid_object_reads_back_as_the_holdings_written() -> None:
    holdings = holdings_of(
        "worker-1", [bundle("b"), bundle("a", D2, complete=False)],
        is_serving=True, address="[fd00::5]:9447",
    )  # fmt: skip
    assert parse_holdings(holdings_object(NODE, holdings)) == holdings


def test_a_target_is_published_and_reads_back() -> None:
    target = HeldTarget("arm64", "node-role.kubernetes.io/edge,zone in (a,b)")
    held = HeldBundle("a", D1, True, 1, 2, target)
    holdings = holdings_of("worker-1", [held, bundle("b")], is_serving=False, address="")
    body = holdings_object(NODE, holdings)
    assert body["spec"]["bundles"][0]["target"] == {
        "architecture": "arm64",
        "nodeSelector": "node-role.kubernetes.io/edge,zone in (a,b)",
    }
    assert "target" not in body["spec"]["bundles"][1]
    assert parse_holdings(body) == holdings


BAD_SPECS: list[tuple[str, dict[str, Any]]] = [
    ("nodeName", {"nodeName": "worker-2"}),
    ("serving", {"serving": "yes"}),
    ("address", {"address": "10.0.0.5"}),
    ("address", {"address": "x" * 400}),
    ("bundleCount", {"bundleCount": -1}),
    ("bundleCount", {"bundleCount": True}),
    ("exceeds", {"bundleCount": 0}),
    ("bundles", {"bundles": "none"}),
    ("out of range", {"bundles": [{}] * (MAX_LISTED_BUNDLES + 1), "bundleCount": 500}),
    ("missing", {"bundles": [{"bundleId": "a"}]}),
]


@pytest.mark.parametrize(("word", "change"), BAD_SPECS)
def test_a_spec_nodeagent_cannot_have_written_is_refused(word: str, change: dict[str, Any]) -> None:
    with pytest.raises(PeerHoldingsInvalid, match=word):
        parse_holdings(published(**change))


ENTRY = {"bundleId": "a", "manifestDigest": D1, "complete": True, "blobs": 1, "bytes": 2}
BAD_ENTRIES: list[dict[str, Any]] = [
    ENTRY | {"bundleId": ".."},
    ENTRY | {"bundleId": "a/b"},
    ENTRY | {"bundleId": "a" * 129},
    ENTRY | {"manifestDigest": "sha256:" + "A" * 64},
    ENTRY | {"complete": 1},
    ENTRY | {"blobs": 1.0},
    ENTRY | {"bytes": 1 << 63},
    ENTRY | {"blobs": False},
    ENTRY | {"target": "amd64"},
    ENTRY | {"target": {"nodeSelector": "a=b"}},
    ENTRY | {"target": {"architecture": "AMD64", "nodeSelector": ""}},
    ENTRY | {"target": {"architecture": "amd64", "nodeSelector": "a=" * 3}},
    ENTRY | {"target": {"architecture": "amd64", "nodeSelector": 5}},
    ENTRY
    | {
        "target": {
            "architecture": "amd64",
            "nodeSelector": "a=b," * (MAX_TARGET_SELECTOR_CHARS // 4 + 1),
        }
    },
]


@pytest.mark.parametrize("entry", BAD_ENTRIES)
def test_a_bundle_entry_out_of_form_is_refused(entry: dict[str, Any]) -> None:
    with pytest.raises(PeerHoldingsInvalid, match=r"bundles\[0\]"):
        parse_holdings(published(bundles=[entry], bundleCount=1))


def test_a_repeated_bundle_id_is_refused() -> None:
    with pytest.raises(PeerHoldingsInvalid, match="repeats"):
        parse_holdings(published(bundles=[ENTRY, ENTRY], bundleCount=2))


def test_a_refusal_message_is_clipped_and_escaped() -> None:
    with pytest.raises(PeerHoldingsInvalid) as caught:
        parse_holdings(published(bundles=[ENTRY | {"bundleId": "\x1b[31m" + "x" * 5000}]))
    assert "\x1b" not in caught.value.message
    assert len(caught.value.message) < 400


NAMELESS: list[object] = [None, [], {}, {"metadata": {"name": "Bad_Name"}}, {"metadata": []}]


@pytest.mark.parametrize("obj", NAMELESS)
def test_an_object_without_a_node_name_is_refused(obj: object) -> None:
    with pytest.raises(PeerHoldingsInvalid, match="node name"):
        parse_holdings(obj)


def test_holders_and_the_manifest_that_differs() -> None:
    held = {
        n: holdings_of(n, [bundle(digest=d, complete=c)], is_serving=True, address="h:1")
        for n, d, c in (("a", D1, True), ("b", D1, False), ("c", D2, True), ("d", D1, True))
    }
    found = holders(held, ["a", "b", "c", "d", "e"], "site-2026-11")
    assert [h.node for h in found] == ["a", "b", "c", "d"]
    assert found[1] == Holder("b", D1, False)
    assert [(c.node, c.manifest_digest, c.expected_digest) for c in digest_conflicts(found)] == [
        ("c", D2, D1)
    ]


def test_a_tie_names_the_same_node_whatever_the_order() -> None:
    pair = [Holder("x", D3, True), Holder("y", D2, True)]
    assert digest_conflicts(pair) == digest_conflicts(pair[::-1])
    assert [c.node for c in digest_conflicts(pair)] == ["x"]
    assert digest_conflicts([Holder("x", D1, True), Holder("y", D1, False)]) == ()
