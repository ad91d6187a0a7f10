"""What a node's store holds, as its peers see it: the ``holdings`` and ``have`` documents.

docs/site.md defines both. The peer server builds them (``holding_of``, ``render_*``);
the fetcher parses what a peer sent (``parse_*``), strictly: JSON by
``nodeagent.strict.loads_json`` (UTF-8, no duplicate keys, no NaN), bounded in size,
every field present, typed and in range, no unknown field. A document that fails is
``PeerAnswerInvalid``: the peer is dropped, never half believed.

``have``'s bitmap: bit *i*, most significant bit first, set when the *i*-th of the
manifest's blobs sorted by digest is stored; the unused bits of the last byte are zero.
Its optional ``fetching`` bitmap, in the same layout, marks the blobs the peer is fetching
now: a fetcher prefers blobs no other node is fetching, so the node that has them all
sends each blob out once rather than to several fetchers at the same time.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Final

from nodeagent.errors import PeerAnswerInvalid
from nodeagent.store.layout import is_bundle_id
from nodeagent.strict import MalformedInput, clip, loads_json

FORMAT_VERSION: Final = 1
MAX_BUNDLES: Final = 4096
"""Bundles one holdings document may list."""
MAX_BLOBS: Final = 1 << 20
"""Blobs one bundle may list (a ``have`` bitmap of at most 128 KiB)."""
MAX_HOLDINGS_BYTES: Final = 4 << 20
MAX_HAVE_BYTES: Final = 256 << 10
MAX_COUNT: Final = (1 << 63) - 1
"""Largest byte or blob count accepted."""
MAX_UPLOADS: Final = 256

_DIGEST: Final = re.compile(r"^sha256:[a-f0-9]{64}$")
_NODE: Final = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9._]{0,251}[A-Za-z0-9])?$")
"""A node name (a Kubernetes Node's, or a host name)."""


@dataclass(frozen=True, slots=True)
class BundleHolding:
    """One bundle in a store: its signed manifest's digest and how much of it is stored."""

    bundle_id: str
    manifest_digest: str
    blobs: int
    blobs_held: int
    bytes: int
    bytes_held: int

    @property
    def is_complete(self) -> bool:
        return self.blobs_held == self.blobs


@dataclass(frozen=True, slots=True)
class Holdings:
    """A node's ``holdings`` document."""

    node: str
    uploads_active: int
    uploads_max: int
    bundles: tuple[BundleHolding, ...]


@dataclass(frozen=True, slots=True)
class Have:
    """A bundle's ``have`` document: which of its blobs (sorted by digest) are stored, and
    which are being fetched now (``fetching``: the same layout; empty when not said)."""

    manifest_digest: str
    blobs: int
    bitmap: bytes
    fetching: bytes = b""

    def is_held(self, index: int) -> bool:
        return _bit(self.bitmap, self.blobs, index)

    def is_fetching(self, index: int) -> bool:
        return bool(self.fetching) and _bit(self.fetching, self.blobs, index)


def _bit(bitmap: bytes, count: int, index: int) -> bool:
    if not 0 <= index < count:
        raise IndexError(index)
    return bool(bitmap[index // 8] & (0x80 >> (index % 8)))


# ---------------------------------------------------------------- building
def holding_of(
    bundle_id: str, manifest_digest: str, sizes: Mapping[str, int], stored: Set[str]
) -> BundleHolding:
    """A bundle's holding: ``sizes`` (digest → size) are its blobs, ``stored`` what the store
    holds."""
    held = [digest for digest in sizes if digest in stored]
    return BundleHolding(
        bundle_id=bundle_id,
        manifest_digest=manifest_digest,
        blobs=len(sizes),
        blobs_held=len(held),
        bytes=sum(sizes.values()),
        bytes_held=sum(sizes[digest] for digest in held),
    )


def have_of(
    manifest_digest: str, digests: Iterable[str], stored: Set[str], fetching: Set[str] = frozenset()
) -> Have:
    """The ``have`` of a bundle whose blobs are ``digests`` (any order): ``stored`` the blobs
    held, ``fetching`` those being fetched now (a stored one is not fetching)."""
    ordered = sorted(set(digests))
    held = _bitmap(ordered, stored)
    under_way = _bitmap(ordered, fetching - stored) if fetching else b""
    return Have(manifest_digest, len(ordered), held, under_way)


def _bitmap(ordered: Sequence[str], marked: Set[str]) -> bytes:
    bitmap = bytearray((len(ordered) + 7) // 8)
    for index, digest in enumerate(ordered):
        if digest in marked:
            bitmap[index // 8] |= 0x80 >> (index % 8)
    return bytes(bitmap)


def _holding_json(holding: BundleHolding) -> dict[str, object]:
    return {
        "bundleId": holding.bundle_id,
        "manifestDigest": holding.manifest_digest,
        "complete": holding.is_complete,
        "blobs": holding.blobs,
        "blobsHeld": holding.blobs_held,
        "bytes": holding.bytes,
        "bytesHeld": holding.bytes_held,
    }


def render_holdings(holdings: Holdings) -> bytes:
    doc = {
        "formatVersion": FORMAT_VERSION,
        "node": holdings.node,
        "uploads": {"active": holdings.uploads_active, "max": holdings.uploads_max},
        "bundles": [_holding_json(h) for h in holdings.bundles],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def render_have(have: Have) -> bytes:
    doc = {
        "manifestDigest": have.manifest_digest,
        "blobs": have.blobs,
        "bitmap": base64.b64encode(have.bitmap).decode(),
    }
    if have.fetching:
        doc["fetching"] = base64.b64encode(have.fetching).decode()
    return json.dumps(doc, separators=(",", ":")).encode()


# ---------------------------------------------------------------- parsing
def _invalid(what: str, problem: str) -> PeerAnswerInvalid:
    return PeerAnswerInvalid(f"peer's {what} document: {clip(problem, 300)}")


def _object(value: object, keys: set[str], what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _invalid(what, "expected a JSON object")
    if set(value) != keys:
        extra, missing = sorted(set(value) - keys), sorted(keys - set(value))
        raise _invalid(what, f"fields missing {missing} or unknown {extra}")
    return value


def _count(doc: Mapping[str, object], key: str, what: str, most: int = MAX_COUNT) -> int:
    value = doc[key]
    if type(value) is not int or not 0 <= value <= most:
        raise _invalid(what, f"{key} must be a whole number from 0 to {most}")
    return value


def _text(doc: Mapping[str, object], key: str, pattern: re.Pattern[str], what: str) -> str:
    value = doc[key]
    if not isinstance(value, str) or pattern.match(value) is None:
        raise _invalid(what, f"{key} is not valid: {value!r}")
    return value


def _load(data: bytes, what: str, max_bytes: int) -> object:
    try:
        return loads_json(data, what=f"peer's {what}", max_bytes=max_bytes, max_depth=6)
    except MalformedInput as err:
        raise PeerAnswerInvalid(str(err)) from None


_HOLDING_KEYS: Final = {"bundleId", "manifestDigest", "complete", "blobs", "blobsHeld",
                        "bytes", "bytesHeld"}  # fmt: skip


def _parse_holding(value: object) -> BundleHolding:
    doc = _object(value, _HOLDING_KEYS, "holdings")
    bundle_id = doc["bundleId"]
    if not isinstance(bundle_id, str) or not is_bundle_id(bundle_id):
        raise _invalid("holdings", f"bundleId is not a bundle id: {bundle_id!r}")
    holding = BundleHolding(
        bundle_id=bundle_id,
        manifest_digest=_text(doc, "manifestDigest", _DIGEST, "holdings"),
        blobs=_count(doc, "blobs", "holdings", MAX_BLOBS),
        blobs_held=_count(doc, "blobsHeld", "holdings", MAX_BLOBS),
        bytes=_count(doc, "bytes", "holdings"),
        bytes_held=_count(doc, "bytesHeld", "holdings"),
    )
    if holding.blobs_held > holding.blobs or holding.bytes_held > holding.bytes:
        raise _invalid("holdings", f"{holding.bundle_id}: holds more than it lists")
    if doc["complete"] is not holding.is_complete:
        raise _invalid("holdings", f"{holding.bundle_id}: complete contradicts the counts")
    return holding


def parse_holdings(data: bytes) -> Holdings:
    """A peer's ``holdings`` document, checked field by field."""
    keys = {"formatVersion", "node", "uploads", "bundles"}
    doc = _object(_load(data, "holdings", MAX_HOLDINGS_BYTES), keys, "holdings")
    if doc["formatVersion"] != FORMAT_VERSION or type(doc["formatVersion"]) is not int:
        raise _invalid("holdings", f"formatVersion must be {FORMAT_VERSION}")
    uploads = _object(doc["uploads"], {"active", "max"}, "holdings")
    bundles = doc["bundles"]
    if not isinstance(bundles, list) or len(bundles) > MAX_BUNDLES:
        raise _invalid("holdings", f"bundles must be a list of at most {MAX_BUNDLES}")
    parsed = tuple(_parse_holding(item) for item in bundles)
    if len({h.bundle_id for h in parsed}) != len(parsed):
        raise _invalid("holdings", "a bundle id is listed twice")
    return Holdings(
        node=_text(doc, "node", _NODE, "holdings"),
        uploads_active=_count(uploads, "active", "holdings", MAX_UPLOADS),
        uploads_max=_count(uploads, "max", "holdings", MAX_UPLOADS),
        bundles=parsed,
    )


def parse_have(data: bytes) -> Have:
    """A peer's ``have`` document: each bitmap's length must match ``blobs`` exactly;
    ``fetching`` is optional (a peer that says nothing is fetching nothing we know of)."""
    keys = {"manifestDigest", "blobs", "bitmap"}
    loaded = _load(data, "have", MAX_HAVE_BYTES)
    if isinstance(loaded, dict) and "fetching" in loaded:
        keys.add("fetching")
    doc = _object(loaded, keys, "have")
    blobs = _count(doc, "blobs", "have", MAX_BLOBS)
    bitmap = _parse_bitmap(doc["bitmap"], blobs, "bitmap")
    fetching = _parse_bitmap(doc["fetching"], blobs, "fetching") if "fetching" in doc else b""
    return Have(_text(doc, "manifestDigest", _DIGEST, "have"), blobs, bitmap, fetching)


def _parse_bitmap(encoded: object, blobs: int, key: str) -> bytes:
    if not isinstance(encoded, str):
        raise _invalid("have", f"{key} must be a base64 string")
    try:
        bitmap = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid("have", f"{key} is not base64") from None
    if len(bitmap) != (blobs + 7) // 8:
        raise _invalid("have", f"{key} has {len(bitmap)} bytes for {blobs} blobs")
    if blobs % 8 and bitmap[-1] & (0xFF >> (blobs % 8)):
        raise _invalid("have", f"bits past the last blob are set in {key}")
    return bitmap
