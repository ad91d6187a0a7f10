"""Discovery (pure): what this node publishes, and the peers it learns of (decision 0029).

* ``held_bundles``: the store's bundles at bundle granularity, from its records, the blobs
  it holds and the digests of the stored ``bundle.json`` files; a bundle whose directory
  holds its signed manifest but no record yet (a fetch under way) is listed as started.
* ``node_address``: where peers reach this node (``[site] advertise``, else the Node's
  InternalIP with the port of ``[site] listen``).
* ``merge_peers``: the published holdings of the other nodes merged with the static
  ``[site] peers`` into one view; ``PeerDirectory`` is the port the fetcher reads it from.
  A peer is the server at an address (its certificate names that address), not what an
  object says of it: two objects that name one address are both unproven claims, so
  that address is listed once, as a static peer is (its holdings asked from the server
  itself), never as one object's bundles hiding the other's (``shared_addresses``).
* ``bundle_steps``: the bundle steps a status reports; a change of them (not of progress)
  is what makes the publisher look at the store again.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from nodeagent.cluster.holdings import HeldBundle, HeldTarget, Holdings
from nodeagent.config.addresses import Address, parse_address
from nodeagent.status import NodeStatus
from nodeagent.store.layout import BundleRecord

# ---------------------------------------------------------------- what this node holds


def record_bundle(
    record: BundleRecord,
    manifest_digest: str,
    stored: Mapping[str, int],
    target: HeldTarget | None = None,
) -> HeldBundle:
    """A stored bundle: complete when every blob its record lists is stored at its size."""
    is_complete = all(stored.get(b.digest) == b.size_bytes for b in record.blobs)
    return HeldBundle(
        record.bundle_id,
        manifest_digest,
        is_complete,
        len(record.blobs),
        record.size_bytes,
        target,
    )


def held_bundles(
    records: Iterable[BundleRecord],
    stored: Mapping[str, int],
    manifest_digests: Mapping[str, str],
    started: Iterable[HeldBundle] = (),
    targets: Mapping[str, HeldTarget] | None = None,
) -> tuple[HeldBundle, ...]:
    """Every signed bundle of the store, sorted by id.

    ``manifest_digests``: bundle id → sha256 of its stored ``bundle.json`` (a record whose
    manifest cannot be read is not listed: it could not be served). ``started``: bundles
    with a manifest but no record yet; a record of the same id wins. Registry sets have no
    signed manifest and are never listed. ``targets``: bundle id → the target its stored
    (verified) ``bundle.json`` names, published with it."""
    found: dict[str, HeldBundle] = {b.bundle_id: b for b in started if not b.is_complete}
    for record in records:
        digest = manifest_digests.get(record.bundle_id)
        if record.is_registry or digest is None:
            continue
        target = (targets or {}).get(record.bundle_id)
        found[record.bundle_id] = record_bundle(record, digest, stored, target)
    return tuple(found[key] for key in sorted(found))


def node_address(node: Mapping[str, Any] | None, *, listen: str, advertise: str) -> str:
    """``advertise`` when set; else the Node's first valid InternalIP with ``listen``'s port;
    ``""`` when neither is known."""
    if advertise:
        return str(parse_address(advertise))
    port = parse_address(listen).port
    status = (node or {}).get("status")
    addresses = status.get("addresses") if isinstance(status, Mapping) else None
    for entry in addresses if isinstance(addresses, list) else []:
        if not isinstance(entry, Mapping) or entry.get("type") != "InternalIP":
            continue
        text = entry.get("address")
        try:
            ip = ipaddress.ip_address(text if isinstance(text, str) else "")
        except ValueError:
            continue
        return str(Address(str(ip), port))
    return ""


def bundle_steps(status: NodeStatus) -> frozenset[tuple[str, str]]:
    """(bundle id, step) of every bundle a status reports: progress does not change it."""
    return frozenset((b.bundle_id, b.state) for b in status.bundles)


# ---------------------------------------------------------------- the peers


@dataclass(frozen=True, slots=True)
class PeerView:
    """A node this one may fetch from."""

    address: str
    """``host:port`` of its peer server."""
    node: str = ""
    """The Node's name; ``""`` for a static peer no discovered node publishes."""
    bundles: tuple[HeldBundle, ...] | None = None
    """What it published; None: unknown (a static peer: ask ``/nodeagent/v1/holdings``)."""

    def holds(self, bundle_id: str) -> HeldBundle | None:
        return next((b for b in self.bundles or () if b.bundle_id == bundle_id), None)


def _normal(address: str) -> str:
    """One spelling per address (an IP in its canonical form, a name in lower case), so a
    static peer and a published address compare; ``""`` when it is not one."""
    try:
        host, port = parse_address(address)
    except ValueError:
        return ""
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        host = host.lower()
    return str(Address(host, port))


def merge_peers(
    own_node: str, published: Iterable[Holdings], static: Sequence[str]
) -> tuple[PeerView, ...]:
    """The discovered peers (other nodes that serve at a known address), then each static
    address no discovered node publishes (holdings unknown). This node is never its own
    peer: neither its object nor a static address equal to the one it publishes."""
    every = list(published)
    own = {_normal(h.address) for h in every if h.node == own_node and h.address}
    shared = shared_addresses(every, own_node)
    found = sorted(
        (h for h in every if h.node != own_node and h.is_serving and h.address),
        key=lambda h: h.node,
    )
    views = []
    for holdings in found:
        address = _normal(holdings.address)
        if address in own or address in shared:
            continue  # nobody's claim is believed: asked below, as a static peer
        views.append(PeerView(address, holdings.node, holdings.bundles))
    views += [PeerView(address) for address in sorted(shared) if address not in own]
    known = own | {v.address for v in views}
    for address in static:
        normal = _normal(address)
        if normal and normal not in known:
            views.append(PeerView(normal))
            known.add(normal)
    return tuple(views)


def shared_addresses(published: Iterable[Holdings], own_node: str) -> dict[str, list[str]]:
    """Address → the nodes whose serving holdings name it, for each address two or more
    other nodes claim (a copied object, or a node posing as another)."""
    claims: dict[str, list[str]] = {}
    for holdings in published:
        if holdings.node != own_node and holdings.is_serving and holdings.address:
            address = _normal(holdings.address)
            if address:
                claims.setdefault(address, []).append(holdings.node)
    return {a: sorted(nodes) for a, nodes in claims.items() if len(nodes) > 1}


class PeerDirectory(Protocol):
    """The peers of this node as discovery knows them (implemented by
    ``site.publishing.PeerWatcher``); the fetcher reads it."""

    def peers(self) -> tuple[PeerView, ...]:
        """The current view: discovered peers first, then static ones."""
        ...

    @property
    def version(self) -> int:
        """Grows by one with each change of ``peers()``."""
        ...

    async def changed(self, since: int) -> int:
        """Wait until ``version`` is no longer ``since``; return the new version."""
        ...


POLL_S: Final = 10.0
"""The fetcher looks at its peers this often when none must be asked (published holdings
wake it when they change; this is the safety net)."""
ASKED_POLL_S: Final = (2.0, 10.0)
"""With peers whose holdings are asked over HTTPS (static peers): 0.4 s per such peer, within
these bounds. Each serving node then answers about 2.5 holdings requests a second at most,
whatever the site's size; a stick's bundle is noticed within about 0.4 s x N (8 nodes: 3 s)."""


def poll_interval_s(peers: Sequence[PeerView]) -> float:
    """How long the fetcher waits between looks at ``peers`` (before its ±20 % spread)."""
    asked = sum(1 for view in peers if view.bundles is None)
    if not asked:
        return POLL_S
    low, high = ASKED_POLL_S
    return min(high, max(low, 0.4 * asked))


class StaticPeers:
    """``PeerDirectory`` without the API (no cluster mode): the ``[site] peers`` alone,
    holdings unknown; the view never changes."""

    def __init__(self, static: Sequence[str]) -> None:
        self._view = merge_peers("", (), static)
        self._never = asyncio.Event()

    def peers(self) -> tuple[PeerView, ...]:
        return self._view

    @property
    def version(self) -> int:
        return 0

    async def changed(self, since: int) -> int:
        if since != 0:
            return 0
        await self._never.wait()  # the configuration is read once: no change to wait for
        return 0
