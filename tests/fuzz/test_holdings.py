"""Fuzz: a peer's published NodeImageHoldings (``cluster.holdings.parse_holdings``), as the
watcher and ``nodeagent site status`` read it from the API server (decoded JSON whose
content another node wrote: untrusted).

Contract: ``parse_holdings`` returns ``Holdings`` or raises ``PeerHoldingsInvalid`` with a
short, escaped message; what it returns goes through the peer merge and the site view
(``discovery.merge_peers``, ``cluster.site.bundle_view``) without an error, and every line
the view prints is short and escaped.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.cluster.holdings import Holdings, parse_holdings
from nodeagent.cluster.site import bundle_view
from nodeagent.errors import PeerHoldingsInvalid
from nodeagent.site.discovery import merge_peers
from tests.fuzz import strategies as s
from tests.fuzz.contract import check_texts, outcome

_DIGEST = "sha256:" + "4" * 64
_OBJECT: dict[str, Any] = {
    "apiVersion": "nodeagent.io/v1alpha1",
    "kind": "NodeImageHoldings",
    "metadata": {"name": "worker-2", "resourceVersion": "7"},
    "spec": {
        "nodeName": "worker-2", "serving": True, "address": "10.0.0.2:9447", "bundleCount": 2,
        "bundles": [
            {"bundleId": "site-1", "manifestDigest": _DIGEST, "complete": True,
             "blobs": 34, "bytes": 1 << 30},
            {"bundleId": "site-2", "manifestDigest": _DIGEST, "complete": False,
             "blobs": 3, "bytes": 300},
        ],
    },
}  # fmt: skip
_PATHS: list[tuple[str | int, ...]] = [
    ("metadata",), ("metadata", "name"), ("spec",), ("spec", "nodeName"), ("spec", "serving"),
    ("spec", "address"), ("spec", "bundleCount"), ("spec", "bundles"), ("spec", "bundles", 0),
    ("spec", "bundles", 1), ("spec", "bundles", 0, "bundleId"),
    ("spec", "bundles", 0, "manifestDigest"), ("spec", "bundles", 0, "complete"),
    ("spec", "bundles", 1, "blobs"), ("spec", "bundles", 1, "bytes"),
    ("spec", "bundles", 0, "extra"),
]  # fmt: skip
_NOW = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)

objects = st.one_of(
    s.json_like,
    st.just(_OBJECT),
    st.builds(s.replaced, st.just(_OBJECT), st.sampled_from(_PATHS), s.json_like),
    st.builds(s.replaced, st.just(_OBJECT), st.sampled_from(_PATHS), s.text),
    st.builds(
        s.replaced, st.just(_OBJECT), st.just(("spec", "bundles")),
        st.lists(st.sampled_from(_OBJECT["spec"]["bundles"]), max_size=300),
    ),
)  # fmt: skip


@given(objects)
@example(s.replaced(_OBJECT, ("spec", "address"), "[::1]:99999"))
@example(s.replaced(_OBJECT, ("spec", "bundles", 0, "bundleId"), "\x1b[2J" * 3000))
@example(s.replaced(_OBJECT, ("metadata", "name"), "w" * 10_000))
@example(s.replaced(_OBJECT, ("spec", "bundleCount"), 10**400))
def test_parse_holdings(obj: Any) -> None:
    result = outcome(
        "cluster.holdings.parse_holdings", lambda: parse_holdings(obj),
        allowed=(PeerHoldingsInvalid,),
    )  # fmt: skip
    if not isinstance(result, Holdings):
        return
    peers = outcome(  # never a valid node name: the peer is never taken for this node
        "site.discovery.merge_peers", lambda: merge_peers("-own-", [result], ["10.0.0.2:9447"]),
        allowed=(),
    )  # fmt: skip
    assert not isinstance(peers, BaseException) and len(peers) == 1
    outcome("cluster.site.bundle_view", lambda: _views(result), allowed=())


def _views(holdings: Holdings) -> None:
    for bundle in holdings.bundles:
        view = bundle_view(
            ["worker-1", holdings.node], {}, bundle.bundle_id,
            now=_NOW, stale_after_s=180, holdings={holdings.node: holdings},
        )  # fmt: skip
        check_texts(view.lines(), "site view of a peer's holdings")
