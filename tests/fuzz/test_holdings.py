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
    _check_holdings(obj)


def _check_holdings(obj: Any) -> None:
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
    assert not isinstance(peers, BaseException)
    addresses = [peer.address for peer in peers]  # one view per node and per address, and the
    assert len(set(addresses)) == len(addresses)  # static address among them
    assert sum(peer.node == result.node for peer in peers) <= 1 and "10.0.0.2:9447" in addresses
    outcome("cluster.site.bundle_view", lambda: _views(result), allowed=())


def _views(holdings: Holdings) -> None:
    for bundle in holdings.bundles:
        view = bundle_view(
            ["worker-1", holdings.node], {}, bundle.bundle_id,
            now=_NOW, stale_after_s=180, holdings={holdings.node: holdings},
        )  # fmt: skip
        check_texts(view.lines(), "site view of a peer's holdings")


# ---------------------------------------------------------------- valid-shaped holdings
# parse_holdings refuses nearly every edited object, so the merge and the site view behind it
# would see a few in a hundred of the inputs above; these objects are of valid shape (names,
# addresses, ids, digests, counts and targets drawn from their grammars, with edge values and
# hostile-but-legal text), so nearly every one reaches them.
_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
_LABEL = st.builds(
    lambda first, middle, last: first + middle + last if middle or last else first,
    st.sampled_from(_ALNUM), st.text(_ALNUM + "-", max_size=61), st.text(_ALNUM, max_size=1),
).filter(lambda label: not label.endswith("-"))  # fmt: skip
_NAMES = st.lists(_LABEL, min_size=1, max_size=4).map(".".join).filter(lambda n: len(n) <= 253)
_ADDRESSES = st.one_of(
    st.just(""),
    st.builds("{}.{}.{}.{}:{}".format, *[st.integers(0, 255)] * 4, st.integers(1, 65535)),
    st.builds("[{}]:{}".format, st.ip_addresses(v=6).map(str), st.integers(1, 65535)),
    st.builds("{}:{}".format, _NAMES, st.integers(1, 65535)),
    st.sampled_from(["[::1]:0", "1.2.3.4:65536", "a:-1", "host", "[fe80::1%eth0]:9447"]),
)  # fmt: skip
_SELECTORS = st.one_of(
    st.just(""),
    st.builds("{}={}".format, _LABEL, _LABEL),
    st.builds("{} in ({},{})".format, _LABEL, _LABEL, _LABEL),
    st.builds("!{},{}!={}".format, _LABEL, _LABEL, _LABEL),
    st.sampled_from(["node-role.kubernetes.io/worker", "a,b,c", "x notin ()", "\x1b[2J=1"]),
)  # fmt: skip
_TARGETS = st.fixed_dictionaries(
    {"architecture": st.text(_ALNUM + "_", min_size=1, max_size=32)},
    optional={"nodeSelector": _SELECTORS},
)
_HELD = st.fixed_dictionaries(
    {
        "bundleId": st.one_of(
            st.text(_ALNUM + "ABCXYZ._-", min_size=1, max_size=16), st.just("Z" * 128)
        ).filter(lambda text: text not in (".", "..")),
        "manifestDigest": st.binary(min_size=32, max_size=32).map(lambda b: f"sha256:{b.hex()}"),
        "complete": st.booleans(),
        "blobs": st.one_of(st.integers(0, 1_000_000), st.sampled_from([0, 1_000_000])),
        "bytes": st.one_of(st.integers(0, (1 << 63) - 1), st.sampled_from([0, (1 << 63) - 1])),
    },
    optional={"target": _TARGETS},
)


@st.composite
def _valid_objects(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(_NAMES)
    bundles = draw(st.lists(_HELD, max_size=8, unique_by=lambda b: str(b["bundleId"])))
    count = len(bundles) + draw(st.one_of(st.just(0), st.integers(0, 100_000 - len(bundles))))
    spec = {
        "nodeName": name, "serving": draw(st.booleans()), "address": draw(_ADDRESSES),
        "bundleCount": count, "bundles": bundles,
    }  # fmt: skip
    return {**_OBJECT, "metadata": {"name": name, "resourceVersion": "1"}, "spec": spec}


@given(_valid_objects())
def test_parse_holdings_valid_shape(obj: Any) -> None:
    _check_holdings(obj)
