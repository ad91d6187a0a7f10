"""The holdings and have documents: what the server renders, the fetcher parses back."""

from __future__ import annotations

import base64
import json

import pytest

from nodeagent.errors import PeerAnswerInvalid
from nodeagent.site.holdings import (
    MAX_BUNDLES,
    Have,
    Holdings,
    have_of,
    holding_of,
    parse_have,
    parse_holdings,
    render_have,
    render_holdings,
)

DIGESTS = [f"sha256:{n:064x}" for n in range(11)]
MANIFEST = f"sha256:{'ab' * 32}"


def sample() -> Holdings:
    sizes = {digest: 100 + i for i, digest in enumerate(DIGESTS)}
    partial = holding_of("site-2026-11", MANIFEST, sizes, set(DIGESTS[::3]))
    whole = holding_of("base.1", f"sha256:{'cd' * 32}", {DIGESTS[0]: 5}, {DIGESTS[0]})
    return Holdings("worker-1", 1, 4, (whole, partial))


def test_holdings_round_trip_and_counts() -> None:
    holdings = sample()
    assert parse_holdings(render_holdings(holdings)) == holdings
    partial = holdings.bundles[1]
    held = DIGESTS[::3]
    assert (partial.blobs, partial.blobs_held) == (11, len(held))
    assert partial.bytes == sum(100 + i for i in range(11))
    assert partial.bytes_held == sum(100 + DIGESTS.index(d) for d in held)
    assert not partial.is_complete
    assert holdings.bundles[0].is_complete
    doc = json.loads(render_holdings(holdings))
    assert [b["complete"] for b in doc["bundles"]] == [True, False]
    assert doc["uploads"] == {"active": 1, "max": 4}


def test_have_bitmap_is_sorted_by_digest_most_significant_bit_first() -> None:
    shuffled = DIGESTS[5:] + DIGESTS[:5]
    have = have_of(MANIFEST, shuffled, {DIGESTS[0], DIGESTS[9], DIGESTS[10]})
    assert have.bitmap == bytes([0b1000_0000, 0b0110_0000])
    assert [i for i in range(have.blobs) if have.is_held(i)] == [0, 9, 10]
    assert parse_have(render_have(have)) == have
    with pytest.raises(IndexError):
        have.is_held(11)


def test_have_says_which_blobs_are_being_fetched() -> None:
    have = have_of(MANIFEST, DIGESTS, {DIGESTS[0]}, {DIGESTS[0], DIGESTS[8]})
    assert have.fetching == bytes([0b0000_0000, 0b1000_0000])  # stored is not fetching
    assert [i for i in range(have.blobs) if have.is_fetching(i)] == [8]
    assert parse_have(render_have(have)) == have
    assert "fetching" not in json.loads(render_have(have_of(MANIFEST, DIGESTS, set())))
    assert not parse_have(render_have(have_of(MANIFEST, DIGESTS, set()))).is_fetching(8)


def test_empty_have() -> None:
    have = have_of(MANIFEST, [], set())
    assert have == Have(MANIFEST, 0, b"")
    assert parse_have(render_have(have)) == have


def _edited(doc: dict[str, object], **changes: object) -> bytes:
    return json.dumps({**doc, **changes}).encode()


HOLDINGS = json.loads(render_holdings(sample()))
BUNDLE = HOLDINGS["bundles"][1]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b'{"formatVersion": 1, "formatVersion": 1}',
        _edited(HOLDINGS, formatVersion=2),
        _edited(HOLDINGS, formatVersion=True),
        _edited(HOLDINGS, node=""),
        _edited(HOLDINGS, node="a/b"),
        _edited(HOLDINGS, extra=1),
        _edited(HOLDINGS, uploads={"active": -1, "max": 4}),
        _edited(HOLDINGS, uploads={"active": 1.0, "max": 4}),
        _edited(HOLDINGS, bundles={}),
        _edited(HOLDINGS, bundles=[BUNDLE, BUNDLE]),
        _edited(HOLDINGS, bundles=[{**BUNDLE, "complete": True}]),
        _edited(HOLDINGS, bundles=[{**BUNDLE, "blobsHeld": 12}]),
        _edited(HOLDINGS, bundles=[{**BUNDLE, "bytesHeld": BUNDLE["bytes"] + 1}]),
        _edited(HOLDINGS, bundles=[{**BUNDLE, "bundleId": ".."}]),
        _edited(HOLDINGS, bundles=[{**BUNDLE, "manifestDigest": "sha256:AB"}]),
        _edited(HOLDINGS, bundles=[{**BUNDLE, "bytes": 2**63}]),
        _edited(HOLDINGS, bundles=[{k: v for k, v in BUNDLE.items() if k != "bytes"}]),
        _edited(HOLDINGS, bundles=[BUNDLE] * (MAX_BUNDLES + 1)),
    ],
)
def test_malformed_holdings_are_refused(data: bytes) -> None:
    with pytest.raises(PeerAnswerInvalid):
        parse_holdings(data)


HAVE = json.loads(render_have(have_of(MANIFEST, DIGESTS, {DIGESTS[1]})))


@pytest.mark.parametrize(
    "data",
    [
        b"{",
        _edited(HAVE, blobs=17),  # a bitmap of 3 bytes
        _edited(HAVE, blobs=-1),
        _edited(HAVE, bitmap="!!"),
        _edited(HAVE, bitmap=base64.b64encode(b"\x40\x01").decode()),  # a bit past blob 10
        _edited(HAVE, bitmap=base64.b64encode(b"\x40").decode()),
        _edited(HAVE, bitmap=7),
        _edited(HAVE, manifestDigest="md5:00"),
        _edited(HAVE, more=True),
        _edited(HAVE, fetching="!!"),
        _edited(HAVE, fetching=base64.b64encode(b"\x40").decode()),  # one byte for 11 blobs
        _edited(HAVE, fetching=base64.b64encode(b"\x00\x01").decode()),  # past blob 10
        _edited(HAVE, fetching=None),
    ],
)
def test_malformed_have_is_refused(data: bytes) -> None:
    with pytest.raises(PeerAnswerInvalid):
        parse_have(data)
