"""What a node's image store holds, as its NodeImageHoldings object (pure; decision 0029).

* ``HeldBundle`` and ``Holdings``: the values, at bundle granularity only (a bundle being
  fetched is one entry, ``is_complete`` false; its blobs are never listed).
* ``holdings_object`` renders the server-side-apply body; ``is_published`` says whether the
  API server already holds exactly that (then nothing is written).
* ``parse_holdings`` reads a node's published object strictly. A peer's object is
  untrusted input: every field is type- and range-checked, lists are bounded, and a
  refusal raises ``PeerHoldingsInvalid`` with a clipped message. Unknown fields are
  ignored (the API server prunes them; a newer agent may add some).
* ``holders`` and ``digest_conflicts``: per bundle id, which nodes hold it and which hold a
  manifest other than the most common one (``nodeagent site status``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.cluster.kinds import NODE_IMAGE_HOLDINGS
from nodeagent.cluster.objects import NodeIdentity
from nodeagent.config.addresses import MAX_ADDRESS_CHARS, parse_address
from nodeagent.errors import ConfigInvalid, PeerHoldingsInvalid
from nodeagent.selectors import parse_selector
from nodeagent.strict import quoted

MAX_LISTED_BUNDLES: Final = 100
"""Bundles listed in the object (the CRD's maxItems); ``bundleCount`` counts all."""
MAX_BUNDLE_COUNT: Final = 100_000
MAX_BLOBS: Final = 1_000_000
MAX_SIZE_BYTES: Final = (1 << 63) - 1
MAX_NAME_CHARS: Final = 253
MAX_TARGET_SELECTOR_CHARS: Final = 4096
"""A published target's nodeSelector (the CRD's maxLength): ``bundle.json``'s own bound."""
_ARCHITECTURE: Final = re.compile(r"[a-z0-9_]{1,32}")
_BUNDLE_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
_DIGEST: Final = re.compile(r"sha256:[a-f0-9]{64}")
_NODE_NAME: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*"
)


@dataclass(frozen=True, slots=True)
class HeldTarget:
    """The target of a held bundle, as its verified ``bundle.json`` says (decision 0028):
    the architecture, and the nodeSelector in canonical form (``""``: none, every node of
    the architecture)."""

    architecture: str
    node_selector: str

    def to_json(self) -> dict[str, str]:
        return {"architecture": self.architecture, "nodeSelector": self.node_selector}


@dataclass(frozen=True, slots=True)
class HeldBundle:
    """One bundle in a node's store: complete, or started (being fetched)."""

    bundle_id: str
    manifest_digest: str
    """sha256 of the bundle's signed ``bundle.json``, byte for byte as stored."""
    is_complete: bool
    blobs: int
    """Blobs the manifest lists (not how many are stored: that moves with every blob)."""
    size_bytes: int
    target: HeldTarget | None = None
    """From the stored manifest; None: not published (an older agent), or over the bound."""

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "bundleId": self.bundle_id,
            "manifestDigest": self.manifest_digest,
            "complete": self.is_complete,
            "blobs": self.blobs,
            "bytes": self.size_bytes,
        }
        return doc | ({"target": self.target.to_json()} if self.target else {})


@dataclass(frozen=True, slots=True)
class Holdings:
    """A node's published holdings and where it serves them."""

    node: str
    is_serving: bool
    address: str
    """``host:port`` peers use; ``""``: not published (the node does not serve)."""
    bundles: tuple[HeldBundle, ...]
    """Sorted by bundle id, at most ``MAX_LISTED_BUNDLES``."""
    bundle_count: int

    def bundle(self, bundle_id: str) -> HeldBundle | None:
        return next((b for b in self.bundles if b.bundle_id == bundle_id), None)


def holdings_of(
    node: str, bundles: Iterable[HeldBundle], *, is_serving: bool, address: str
) -> Holdings:
    """The value to publish: complete bundles are listed before started ones when there are
    more than ``MAX_LISTED_BUNDLES``; the list is sorted by id either way."""
    every = list(bundles)
    chosen = sorted(every, key=lambda b: (not b.is_complete, b.bundle_id))[:MAX_LISTED_BUNDLES]
    return Holdings(
        node,
        is_serving,
        address if is_serving else "",
        tuple(sorted(chosen, key=lambda b: b.bundle_id)),
        len(every),
    )


# ---------------------------------------------------------------- writing


def holdings_spec(holdings: Holdings) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": holdings.node,
        "serving": holdings.is_serving,
        "bundleCount": holdings.bundle_count,
        "bundles": [b.to_json() for b in holdings.bundles],
    }
    if holdings.address:
        spec["address"] = holdings.address
    return spec


def holdings_object(node: NodeIdentity, holdings: Holdings) -> dict[str, Any]:
    """The server-side-apply body: named after the node, owned by it once its uid is known."""
    metadata: dict[str, Any] = {"name": node.name}
    if node.uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}
        ]
    return {
        "apiVersion": NODE_IMAGE_HOLDINGS.api_version,
        "kind": NODE_IMAGE_HOLDINGS.kind,
        "metadata": metadata,
        "spec": holdings_spec(holdings),
    }


def _owner_uids(obj: Mapping[str, Any]) -> set[str]:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {str(o.get("uid")) for o in owners if isinstance(o, Mapping) and o.get("kind") == "Node"}


def is_published(body: Mapping[str, Any], observed: Mapping[str, Any] | None) -> bool:
    """Whether the API server's object already says what ``body`` says (spec and owner):
    then applying it would change nothing and is not done."""
    if observed is None:
        return False
    return observed.get("spec") == body.get("spec") and _owner_uids(observed) == _owner_uids(body)


# ---------------------------------------------------------------- reading a peer's object


def _refuse(name: str, what: str) -> PeerHoldingsInvalid:
    return PeerHoldingsInvalid(f"NodeImageHoldings {name}: {what}")


def _int(value: object, low: int, high: int) -> int | None:
    if type(value) is not int or not low <= value <= high:
        return None
    return value


def _field(spec: Mapping[str, Any], key: str, where: str, name: str) -> Any:
    if key not in spec:
        raise _refuse(name, f"{where}{key} is missing")
    return spec[key]


def _bundle(item: object, index: int, name: str) -> HeldBundle:
    where = f"bundles[{index}]."
    if not isinstance(item, Mapping):
        raise _refuse(name, f"bundles[{index}] is not an object")
    bundle_id = _field(item, "bundleId", where, name)
    if (
        not isinstance(bundle_id, str)
        or not _BUNDLE_ID.fullmatch(bundle_id)
        or bundle_id
        in (
            ".",
            "..",
        )
    ):
        raise _refuse(name, f"{where}bundleId {quoted(bundle_id, 140)} is not a bundle id")
    digest = _field(item, "manifestDigest", where, name)
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise _refuse(name, f"{where}manifestDigest {quoted(digest, 80)} is not a sha256 digest")
    complete = _field(item, "complete", where, name)
    if not isinstance(complete, bool):
        raise _refuse(name, f"{where}complete must be true or false")
    blobs = _int(_field(item, "blobs", where, name), 0, MAX_BLOBS)
    size = _int(_field(item, "bytes", where, name), 0, MAX_SIZE_BYTES)
    if blobs is None or size is None:
        raise _refuse(name, f"{where}blobs and bytes must be whole numbers in range")
    return HeldBundle(bundle_id, digest, complete, blobs, size, _target(item, where, name))


def _target(item: Mapping[str, Any], where: str, name: str) -> HeldTarget | None:
    """The optional ``target``: a GOARCH name and a bounded, parseable nodeSelector."""
    if "target" not in item:
        return None
    value = item["target"]
    if not isinstance(value, Mapping):
        raise _refuse(name, f"{where}target is not an object")
    arch = value.get("architecture")
    if not isinstance(arch, str) or not _ARCHITECTURE.fullmatch(arch):
        raise _refuse(name, f"{where}target.architecture {quoted(arch, 40)} is not a GOARCH name")
    text = value.get("nodeSelector", "")
    if not isinstance(text, str) or len(text) > MAX_TARGET_SELECTOR_CHARS:
        raise _refuse(
            name, f"{where}target.nodeSelector is not a string of at most "
            f"{MAX_TARGET_SELECTOR_CHARS} characters",
        )  # fmt: skip
    try:
        parse_selector(text)
    except ConfigInvalid:
        raise _refuse(
            name, f"{where}target.nodeSelector {quoted(text, 100)} is not a label selector"
        ) from None
    return HeldTarget(arch, text)


def object_name(obj: object) -> str:
    """The object's name if it is a node name; ``""`` otherwise."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if isinstance(name, str) and len(name) <= MAX_NAME_CHARS and _NODE_NAME.fullmatch(name):
        return name
    return ""


def parse_holdings(obj: object) -> Holdings:
    """A node's NodeImageHoldings as a value; ``PeerHoldingsInvalid`` when it is not one
    nodeagent could have written."""
    name = object_name(obj)
    if not name:
        raise PeerHoldingsInvalid("a NodeImageHoldings object has no valid node name")
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    shown = quoted(name, MAX_NAME_CHARS)
    if not isinstance(spec, Mapping):
        raise _refuse(shown, "spec is missing")
    if _field(spec, "nodeName", "spec.", shown) != name:
        raise _refuse(shown, "spec.nodeName is not the object's name")
    serving = _field(spec, "serving", "spec.", shown)
    if not isinstance(serving, bool):
        raise _refuse(shown, "spec.serving must be true or false")
    address = spec.get("address", "")
    if not isinstance(address, str) or len(address) > MAX_ADDRESS_CHARS:
        raise _refuse(shown, "spec.address is not a host:port")
    if address:
        try:
            parse_address(address)
        except ValueError as err:
            raise _refuse(shown, f"spec.address {quoted(address, 100)}: {err}") from None
    count = _int(_field(spec, "bundleCount", "spec.", shown), 0, MAX_BUNDLE_COUNT)
    items = _field(spec, "bundles", "spec.", shown)
    if count is None or not isinstance(items, list) or len(items) > MAX_LISTED_BUNDLES:
        raise _refuse(
            shown, f"spec.bundleCount or spec.bundles out of range (at most {MAX_LISTED_BUNDLES})"
        )
    bundles = tuple(_bundle(item, i, shown) for i, item in enumerate(items))
    ids = [b.bundle_id for b in bundles]
    if len(set(ids)) != len(ids) or len(ids) > count:
        raise _refuse(shown, "spec.bundles repeats a bundle id or exceeds spec.bundleCount")
    listed = tuple(sorted(bundles, key=lambda b: b.bundle_id))
    return Holdings(name, serving, address, listed, count)


# ---------------------------------------------------------------- the site view


@dataclass(frozen=True, slots=True)
class Holder:
    node: str
    manifest_digest: str
    is_complete: bool


@dataclass(frozen=True, slots=True)
class DigestConflict:
    node: str
    manifest_digest: str
    expected_digest: str


def holders(
    holdings: Mapping[str, Holdings], nodes: Sequence[str], bundle_id: str
) -> tuple[Holder, ...]:
    """The nodes of ``nodes`` whose published holdings list ``bundle_id``, in that order."""
    found = []
    for node in nodes:
        held = holdings[node].bundle(bundle_id) if node in holdings else None
        if held is not None:
            found.append(Holder(node, held.manifest_digest, held.is_complete))
    return tuple(found)


def digest_conflicts(found: Iterable[Holder]) -> tuple[DigestConflict, ...]:
    """Holders whose manifest digest differs from the most common one (ties: the smallest
    digest is taken as the common one, so the answer does not depend on the order)."""
    by_node = {h.node: h.manifest_digest for h in found}
    counts = Counter(by_node.values())
    if len(counts) < 2:
        return ()
    common = min(counts, key=lambda d: (-counts[d], d))
    return tuple(
        DigestConflict(node, digest, common)
        for node, digest in sorted(by_node.items())
        if digest != common
    )


def bundle_ids_held(holdings: Iterable[Holdings]) -> set[str]:
    return {b.bundle_id for h in holdings for b in h.bundles}
