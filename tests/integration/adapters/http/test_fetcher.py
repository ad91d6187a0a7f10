"""The fetcher against real peer servers, real stores and real mutual TLS, on loopback.

Each peer is a ``PeerServer`` over its own store (filled from a signed bundle by the store's
copier, or left half done as a fetch under way); the fetching node is the fetcher service
with its real adapters (``PeerClient``, ``FetchStore``); only the import into CRI-O is
replaced by a recorder (the three-node test in tests/integration/testenv runs it for
real). Lying peers are real too: a peer whose stored blob was damaged, and a
TLS-terminating proxy holding a valid node certificate that flips one byte of each blob it
relays in front of an honest peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ssl
from collections.abc import AsyncIterator, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.http.client import PeerClient
from nodeagent.adapters.http.peer import PeerServer
from nodeagent.adapters.http.tls import ReloadingClientTls, ReloadingTls
from nodeagent.adapters.store import keeper
from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import StoreLimits, copy_bundle
from nodeagent.adapters.store.fetched import FetchStore
from nodeagent.errors import PeerUnreachable
from nodeagent.site.discovery import PeerView
from nodeagent.site.fetcher import BundleFetcher
from nodeagent.site.fetching import SignedBundle
from nodeagent.site.follow import NodeFacts
from nodeagent.site.transfer import FetcherPorts, FetchTimings
from nodeagent.status import BundleReport
from nodeagent.store import layout
from nodeagent.store.keeping import KeepRules
from tests.testenv.pki import Authority
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle
from tests.testenv.waiting import wait_for_async

MIB = 1 << 20
BUNDLE_ID = "site-2026-11"

pytestmark = pytest.mark.integration


@dataclass
class Site:
    tmp: Path
    ca: Authority
    ca_file: Path
    keys: Keys
    bundle: Signed
    servers: list[PeerServer] = field(default_factory=list)

    def node_store(self, name: str, *, complete: bool = True) -> Path:
        store = self.tmp / name / "store"
        copy_bundle(store, self.bundle.root, self.bundle.manifest, self.keys.trusted_dir)
        if not complete:  # a fetch under way: signed manifest and some blobs, no record
            (store / layout.bundle_dir(BUNDLE_ID) / layout.RECORD_NAME).unlink()
        return store

    def server_tls(self, name: str) -> ReloadingTls:
        pem = self.tmp / f"{name}-server.pem"
        self.ca.serving(name).write_pair(pem, pem)
        return ReloadingTls(pem, pem, self.ca_file)

    async def serve(
        self, name: str, store: Path, *, upload_max_bytes: int = 0, offer_ttl_s: float = 0
    ) -> str:
        server = PeerServer(
            store,
            self.server_tls(name),
            node=name,
            host="127.0.0.1",
            port=0,
            max_uploads=4,
            upload_max_bytes=upload_max_bytes,
            request_timeout_s=10,
            offer_ttl_s=offer_ttl_s,
        )
        await server.start()
        self.servers.append(server)
        return f"127.0.0.1:{server.port}"

    def client(self, name: str = "fetcher") -> PeerClient:
        pem = self.tmp / f"{name}-client.pem"
        self.ca.client(name).write_pair(pem, pem)
        return PeerClient(ReloadingClientTls(pem, pem, self.ca_file), request_timeout_s=5)


@contextlib.asynccontextmanager
async def site_of(tmp_path: Path, keys: Keys, bundle: Signed) -> AsyncIterator[Site]:
    """A site with its own CA around ``bundle``; every peer server it started closed after."""
    ca = Authority("site CA")
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    found = Site(tmp_path, ca, ca_file, keys, bundle)
    try:
        yield found
    finally:
        for server in found.servers:
            await server.close(grace_s=1)


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    keys = Keys.make(tmp_path / "keys")
    cache = tmp_path / "layers"
    app = image("example/app", [(MIB, 1), (2 * MIB, 2)], cache)
    tools = image("example/tools", [(MIB, 1), (MIB // 2, 3)], cache)
    bundle = signed_bundle(
        tmp_path / "stick", keys, [app, tools], bundle_id=BUNDLE_ID, set_name="site"
    )
    async with site_of(tmp_path, keys, bundle) as found:
        yield found


@dataclass
class Node:
    """The fetching node: its store, its fetcher, what it imported and reported."""

    store: Path
    fetcher: BundleFetcher
    client: PeerClient
    imported: list[str] = field(default_factory=list)
    reports: list[BundleReport] = field(default_factory=list)

    async def look(self, *addresses: str) -> None:
        await self.fetcher.look([PeerView(a) for a in addresses])

    def stored_blobs(self) -> dict[str, int]:
        return BlobStore(self.store).stored()


def fetching_node(
    site: Site,
    *,
    trusted_dir: Path | None = None,
    limits: StoreLimits | None = None,
    clock: Callable[[], float] | None = None,
    state: JsonStateStore | None = None,
    import_state: str = "imported",
    own_node: str = "",
) -> Node:
    store = site.tmp / "fetcher" / "store"
    client = site.client()
    fetch_store = FetchStore(store, trusted_dir or site.keys.trusted_dir, limits or StoreLimits())
    architecture = site.bundle.manifest.architecture
    node = Node(store, None, client)  # type: ignore[arg-type]  # the fetcher is set below

    def facts(held: dict[str, str]) -> NodeFacts:
        return NodeFacts("on", False, True, architecture, None, held)

    async def import_bundle(signed: SignedBundle, source: str) -> BundleReport:
        node.imported.append(signed.manifest.bundle_id)
        return BundleReport(source, import_state, bundle_id=signed.manifest.bundle_id)  # type: ignore[arg-type]

    ports = FetcherPorts(
        client,
        fetch_store,
        facts,
        import_bundle,
        report=node.reports.append,
        state=state,
        own_node=own_node,
        timings=FetchTimings(have_refresh_s=0.5, stall_s=5.0),
    )
    if clock is not None:
        ports.clock = clock
    node.fetcher = BundleFetcher(ports, concurrency=4)
    return node


def assert_store_holds_only_verified_blobs(store: Path, signed: Signed) -> None:
    blobs = BlobStore(store)
    for digest, size in blobs.stored().items():
        data = blobs.path(digest).read_bytes()
        assert len(data) == size
        assert f"sha256:{hashlib.sha256(data).hexdigest()}" == digest
    assert set(blobs.stored()) == set(signed.manifest.blobs)


def events(logs: Sequence[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


def served(site: Site) -> list[int]:
    return [s.counters.bytes_served for s in site.servers]


# ------------------------------------------------------------------ the path
async def test_a_bundle_is_fetched_from_two_peers_verified_recorded_and_imported(
    site: Site,
) -> None:
    a = await site.serve("node-0", site.node_store("node-0"))
    b = await site.serve("node-1", site.node_store("node-1"))
    node = fetching_node(site)
    with capture_logs() as logs:
        await node.look(a, b)
        await node.look(a, b)  # held now: nothing more
    await node.client.close()
    assert node.imported == [BUNDLE_ID]
    assert_store_holds_only_verified_blobs(node.store, site.bundle)
    record = node.store / layout.bundle_dir(BUNDLE_ID) / layout.RECORD_NAME
    assert record.is_file()
    assert all(n > 0 for n in served(site)), served(site)  # the load was spread
    total = sum(f.size_bytes for f in site.bundle.manifest.blobs.values())
    assert sum(served(site)) == total  # every byte once
    (fetched,) = events(logs, "bundle_fetched")
    assert fetched["bundle"] == BUNDLE_ID
    assert set(str(fetched["from_peers"]).split(",")) == {a, b}
    assert len(events(logs, "bundle_fetch_started")) == 1
    states = [r.state for r in node.reports]
    assert states[0] == "fetching" and states[-1] == "stored"
    assert node.reports[-1].progress is not None
    assert node.reports[-1].progress["doneBytes"] == total


async def test_a_peer_that_gets_the_bundle_during_the_fetch_is_used_and_never_dropped(
    site: Site,
) -> None:
    """Nodes that start together feed each other: a peer that held nothing when the fetch
    began is asked at each refresh, not dropped, and fetched from once it holds blobs."""
    slow = await site.serve("node-0", site.node_store("node-0"), upload_max_bytes=MIB)
    late_store = site.tmp / "node-1" / "store"
    late_store.mkdir(parents=True)
    late = await site.serve("node-1", late_store)
    node = fetching_node(site)
    with capture_logs() as logs:
        look = asyncio.create_task(node.look(slow, late))

        async def some_stored() -> dict[str, int]:
            return node.stored_blobs()

        # the fetch is under way, from node 0 alone
        await wait_for_async(some_stored, timeout_s=60, interval_s=0.05, what="a first blob")
        assert served(site)[1] == 0
        site.node_store("node-1")  # node 1 now holds the whole bundle (as after its stick)
        await look
    await node.client.close()
    assert node.imported == [BUNDLE_ID]
    assert_store_holds_only_verified_blobs(node.store, site.bundle)
    assert served(site)[1] > 0, served(site)  # node 1 served blobs it did not have at first
    assert not events(logs, "bundle_fetch_peer_dropped")
    (fetched,) = events(logs, "bundle_fetched")
    assert set(str(fetched["from_peers"]).split(",")) == {slow, late}


async def test_a_bundle_stored_after_the_offer_was_read_is_served_at_once(site: Site) -> None:
    """The holdings publisher may announce a bundle within the offer's TTL: a request for a
    bundle the cached offer lacks looks at the store again instead of answering 404 (peers
    took that for a failure and waited their backoff: seen in the site gate test)."""
    store = site.tmp / "node-0" / "store"
    store.mkdir(parents=True)
    address = await site.serve("node-0", store, offer_ttl_s=3600)
    client = site.client()
    try:
        assert (await client.holdings(address)).bundles == ()  # the offer is read, empty
        site.node_store("node-0")
        data = await client.bundle_file(address, BUNDLE_ID, "bundle.json", 1 << 20)
        assert data == (site.bundle.root / "bundle.json").read_bytes()
    finally:
        await client.close()


async def test_a_node_being_fetched_serves_what_it_has_and_its_blobs_are_kept(
    site: Site,
) -> None:
    store = site.node_store("node-1", complete=False)
    gone = max(site.bundle.manifest.blobs.items(), key=lambda kv: kv[1].size_bytes)[0]
    BlobStore(store).path(gone).unlink()
    address = await site.serve("node-1", store)
    client = site.client()
    try:
        holdings = await client.holdings(address)
        (holding,) = holdings.bundles
        assert not holding.is_complete
        assert holding.blobs_held == len(site.bundle.manifest.blobs) - 1
        have = await client.have(address, BUNDLE_ID)
        ordered = sorted(site.bundle.manifest.blobs)
        assert [ordered[i] for i in range(have.blobs) if not have.is_held(i)] == [gone]
        some = next(d for d in ordered if d != gone)
        got = bytearray()

        async def write(chunk: bytes) -> None:
            got.extend(chunk)

        size = site.bundle.manifest.blobs[some].size_bytes
        await client.blob(address, some, offset=0, size_bytes=size, write=write)
        assert f"sha256:{hashlib.sha256(got).hexdigest()}" == some
    finally:
        await client.close()
    # the keeper keeps the blobs of a bundle being fetched (no record refers to them)
    collected = keeper.collect(store, [], KeepRules(gc_grace_s=0, keep_newest_per_channel=True))
    assert collected.removed == ()
    assert len(BlobStore(store).stored()) == len(site.bundle.manifest.blobs) - 1


async def test_a_fetch_cut_off_resumes_from_its_partials_and_its_signed_manifest(
    site: Site,
) -> None:
    a = await site.serve("node-0", site.node_store("node-0"))
    node = fetching_node(site)
    signed = node.fetcher.ports.store.verify(
        (site.bundle.root / "bundle.json").read_bytes(),
        (site.bundle.root / "bundle.json.minisig").read_bytes(),
    )
    node.fetcher.ports.store.begin(signed)  # what a run cut off left: manifest, no record
    by_size = sorted(site.bundle.manifest.blobs.items(), key=lambda kv: -kv[1].size_bytes)
    (largest, file), (second, whole) = by_size[:2]
    half = file.size_bytes // 2
    partial = node.store / layout.partial_path(largest)
    partial.write_bytes(site.bundle.blob_file(largest).read_bytes()[:half])
    # one written whole but cut off before its rename: not asked for again
    whole_partial = node.store / layout.partial_path(second)
    whole_partial.write_bytes(site.bundle.blob_file(second).read_bytes())
    with capture_logs() as logs:
        await node.look(a)
    await node.client.close()
    assert events(logs, "bundle_fetch_resumed")
    assert node.imported == [BUNDLE_ID]
    assert_store_holds_only_verified_blobs(node.store, site.bundle)
    total = sum(f.size_bytes for f in site.bundle.manifest.blobs.values())
    # the half and the whole blob already there were not fetched again
    assert served(site) == [total - half - whole.size_bytes]
    assert not events(logs, "bundle_fetch_peer_dropped")


async def test_a_fetched_bundle_whose_import_a_restart_cut_off_is_imported_at_start(
    site: Site,
) -> None:
    a = await site.serve("node-0", site.node_store("node-0"))
    state = JsonStateStore(site.tmp / "fetcher" / "state")
    first = fetching_node(site, state=state, import_state="interrupted")  # CRI-O went away
    await first.look(a)
    await first.client.close()
    assert first.imported == [BUNDLE_ID]
    digest = hashlib.sha256((site.bundle.root / "bundle.json").read_bytes()).hexdigest()
    assert state.load("fetched-imports") == {"bundles": {BUNDLE_ID: f"sha256:{digest}"}}
    restarted = fetching_node(site, state=state)  # the daemon starts again
    with capture_logs() as logs:
        await restarted.look(a)
        await restarted.look(a)
    await restarted.client.close()
    assert events(logs, "bundle_import_resumed")
    assert restarted.imported == [BUNDLE_ID]  # once, without fetching anything again
    assert not events(logs, "bundle_fetch_started")
    assert state.load("fetched-imports") == {"bundles": {}}


async def test_a_static_peer_that_is_this_node_itself_is_not_fetched_from(site: Site) -> None:
    itself = await site.serve("node-7", site.node_store("node-7"))  # listed under another address
    node = fetching_node(site, own_node="node-7")
    with capture_logs() as logs:
        await node.look(itself)
    await node.client.close()
    assert not events(logs, "bundle_fetch_started")
    assert node.imported == [] and node.stored_blobs() == {}


# ------------------------------------------------------------------ lying peers
async def test_a_peer_with_a_damaged_blob_is_dropped_and_the_blob_fetched_elsewhere(
    site: Site,
) -> None:
    """The honest peer is itself still fetching and lacks the damaged blob at first, so the
    liar is asked for it; the blob arrives at the honest peer later (its next ``have``)."""
    damaged_store = site.node_store("node-0")
    largest = max(site.bundle.manifest.blobs.items(), key=lambda kv: kv[1].size_bytes)[0]
    path = BlobStore(damaged_store).path(largest)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # a compromised or failing disk: same size, other bytes
    path.write_bytes(bytes(data))
    liar = await site.serve("node-0", damaged_store)
    honest_store = site.node_store("node-1", complete=False)
    held_back = site.tmp / "held-back"
    BlobStore(honest_store).path(largest).rename(held_back)
    honest = await site.serve("node-1", honest_store)
    node = fetching_node(site)
    with capture_logs() as logs:
        looking = asyncio.create_task(node.look(liar, honest))
        deadline = asyncio.get_running_loop().time() + 30
        while not events(logs, "bundle_fetch_peer_dropped"):  # the liar was asked and cut
            assert not looking.done(), logs
            assert asyncio.get_running_loop().time() < deadline, logs
            await asyncio.sleep(0.05)
        held_back.rename(BlobStore(honest_store).path(largest))  # the honest peer got it
        await asyncio.wait_for(looking, 30)
    await node.client.close()
    assert site.servers[0].corrupt  # the liar's server found its blob damaged and cut it
    dropped = events(logs, "bundle_fetch_peer_dropped")
    assert [(d["peer"], d["reason"]) for d in dropped] == [(liar, "PeerUnreachable")]
    assert node.imported == [BUNDLE_ID]
    assert_store_holds_only_verified_blobs(node.store, site.bundle)
    assert not BlobStore(node.store).partials()


class FlippingProxy:
    """TLS in front of a real peer with a valid node certificate: relays everything, and
    flips the first body byte of every blob answer (a compromised node's server), or of
    every answer to a request naming ``marker``."""

    def __init__(self, site: Site, upstream: str, *, marker: bytes = b"/blobs/") -> None:
        self.site, self.upstream = site, upstream
        self.marker = marker
        """Answers to requests whose line holds this are flipped (default: blobs)."""
        self.server: asyncio.Server | None = None
        self.flipped = 0

    async def start(self) -> str:
        tls = self.site.server_tls("node-9").context
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=tls)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pem = self.site.tmp / "node-9-client.pem"
        self.site.ca.client("node-9").write_pair(pem, pem)
        context = ssl.create_default_context(cafile=str(self.site.ca_file))
        context.load_cert_chain(pem)
        host, port = self.upstream.split(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port), ssl=context)
        pending: list[bool] = []  # one entry per request relayed: is it a blob?

        async def upward() -> None:
            while data := await reader.read(65536):
                if data.startswith(b"GET "):
                    pending.append(self.marker in data.split(b"\r\n", 1)[0])
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def downward() -> None:
            state = "idle"
            while data := await up_reader.read(65536):
                chunk = bytearray(data)
                if state == "idle" and pending and chunk.startswith(b"HTTP/1.1 "):
                    state = "head" if pending.pop(0) else "idle"
                if state == "head" and (end := chunk.find(b"\r\n\r\n")) >= 0:
                    state = "body" if end + 4 == len(chunk) else "idle"
                    if end + 4 < len(chunk):
                        chunk[end + 4] ^= 0x01
                        self.flipped += 1
                elif state == "body":
                    chunk[0] ^= 0x01
                    self.flipped += 1
                    state = "idle"
                writer.write(bytes(chunk))
                await writer.drain()
            writer.close()

        with contextlib.suppress(Exception):
            await asyncio.gather(upward(), downward())


async def test_a_proxy_with_a_valid_certificate_that_flips_bytes_is_dropped(
    site: Site,
) -> None:
    honest = await site.serve("node-0", site.node_store("node-0"))
    proxy = FlippingProxy(site, honest)
    liar = await proxy.start()
    node = fetching_node(site)
    try:
        with capture_logs() as logs:
            await node.look(liar, honest)
    finally:
        await node.client.close()
        await proxy.close()
    assert proxy.flipped >= 1  # it was asked, and lied
    dropped = events(logs, "bundle_fetch_peer_dropped")
    assert [(d["peer"], d["reason"]) for d in dropped] == [(liar, "StoreSourceMismatch")]
    assert node.imported == [BUNDLE_ID]
    assert_store_holds_only_verified_blobs(node.store, site.bundle)
    assert not BlobStore(node.store).partials()  # the wrong bytes were not kept either


# ------------------------------------------------------------------ refusals
async def test_a_bundle_signed_by_an_untrusted_key_is_never_fetched(site: Site) -> None:
    a = await site.serve("node-0", site.node_store("node-0"))
    other = Keys.make(site.tmp / "other-keys")  # this node trusts another key only
    node = fetching_node(site, trusted_dir=other.trusted_dir)
    with capture_logs() as logs:
        await node.look(a)
    await node.client.close()
    (refused,) = events(logs, "bundle_fetch_refused")
    assert refused["reason"] == "BundleSignedByUnknownKey"
    assert node.reports[-1].state == "rejected"
    assert node.reports[-1].reason == "BundleSignedByUnknownKey"
    assert node.imported == []
    assert not (node.store / layout.BUNDLES_DIR / BUNDLE_ID).exists()
    assert node.stored_blobs() == {}
    assert served(site) == [0]  # no blob was asked for


async def test_a_store_too_small_refuses_before_the_first_byte_and_says_why(
    site: Site,
) -> None:
    a = await site.serve("node-0", site.node_store("node-0"))
    node = fetching_node(site, limits=StoreLimits(max_bytes=MIB))
    with capture_logs() as logs:
        await node.look(a)
        await node.look(a)  # looked at again only after the backoff: said once
    await node.client.close()
    (failed,) = events(logs, "bundle_fetch_failed")
    assert failed["reason"] == "StoreFull"
    assert node.reports[-1].state == "rejected" and node.reports[-1].reason == "StoreFull"
    assert "[store] max_bytes" in (node.reports[-1].message or "")
    assert node.stored_blobs() == {}
    assert not (node.store / layout.BUNDLES_DIR / BUNDLE_ID).exists()
    assert served(site) == [0]


async def test_no_peer_left_fails_with_its_reason_and_keeps_what_was_stored(
    site: Site,
) -> None:
    store = site.node_store("node-1", complete=False)
    gone = max(site.bundle.manifest.blobs.items(), key=lambda kv: kv[1].size_bytes)[0]
    BlobStore(store).path(gone).unlink()  # the only peer lacks one blob, and stays so
    a = await site.serve("node-1", store)
    now = [0.0]
    node = fetching_node(site, clock=lambda: now[0])

    async def ticking() -> None:
        while True:
            await asyncio.sleep(0.05)
            now[0] += 1.0

    ticker = asyncio.create_task(ticking())
    try:
        with capture_logs() as logs:
            await node.look(a)
    finally:
        ticker.cancel()
        await node.client.close()
    (failed,) = events(logs, "bundle_fetch_failed")
    assert failed["reason"] == "NoPeerLeft"
    assert node.reports[-1].reason == "NoPeerLeft"
    assert len(node.stored_blobs()) == len(site.bundle.manifest.blobs) - 1
    assert node.imported == []


async def test_a_peer_whose_certificate_is_not_the_sites_or_not_its_address_is_refused(
    site: Site,
) -> None:
    """The fetcher checks the server too: a certificate from another CA, or one that does
    not name the address asked (peers are asked by IP), fails the handshake."""
    store = site.node_store("node-0")
    intruder_pem = site.tmp / "intruder.pem"
    Authority("another CA").serving("node-0").write_pair(intruder_pem, intruder_pem)
    elsewhere_pem = site.tmp / "elsewhere.pem"
    site.ca.serving("node-0", ip="127.0.0.2").write_pair(elsewhere_pem, elsewhere_pem)
    addresses = []
    for pem in (intruder_pem, elsewhere_pem):
        server = PeerServer(
            store,
            ReloadingTls(pem, pem, site.ca_file),
            node="node-0",
            host="127.0.0.1",
            port=0,
            max_uploads=4,
            upload_max_bytes=0,
            request_timeout_s=10,
        )
        await server.start()
        site.servers.append(server)
        addresses.append(f"127.0.0.1:{server.port}")
    client = site.client()
    try:
        for address in addresses:
            with pytest.raises(PeerUnreachable, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
                await client.holdings(address)
    finally:
        await client.close()
    assert [s.counters.requests for s in site.servers] == [0, 0]


# ------------------------------------------------------------------ anti-rollback
async def test_a_bundle_older_than_one_the_node_holds_is_not_fetched(site: Site) -> None:
    """The peer offers the site bundle (format 1: its sequence is its created time); the
    fetching node's store holds a newer signed manifest of the same key and channel, of
    format 3: the older format is refused first (``BundleFormatDowngrade``, a rollback;
    decision 0040's amendment), the sequence would be too."""
    newer_images = [image("example/newer", [(MIB // 4, 9)], site.tmp / "layers")]
    newer = signed_bundle(
        site.tmp / "newer", site.keys, newer_images, bundle_id="site-2027", set_name="site",
        sequence=site.bundle.manifest.sequence + 1,
    )  # fmt: skip
    a = await site.serve("node-0", site.node_store("node-0"))
    node = fetching_node(site)
    copy_bundle(node.store, newer.root, newer.manifest, site.keys.trusted_dir)
    with capture_logs() as logs:
        await node.look(a)
    [skipped] = events(logs, "bundle_not_followed")
    assert (skipped["bundle"], skipped["reason"]) == (BUNDLE_ID, "Rollback")
    assert "format 1, older than bundle site-2027 (format 3)" in skipped["message"]
    assert node.imported == [] and served(site) == [0]
    assert not (node.store / layout.bundle_dir(BUNDLE_ID)).exists()
    await node.client.close()


# ------------------------------------------------------------------ a straggler moved
class DrippingProxy(FlippingProxy):
    """TLS in front of a real peer with a valid node certificate: relays everything at once
    but the body of a blob answer, which it sends one byte a second (a peer that says it is
    idle and drips)."""

    def __init__(self, site: Site, upstream: str) -> None:
        super().__init__(site, upstream)
        self.dripped = 0
        self.handlers: set[asyncio.Task[Any]] = set()

    async def close(self) -> None:
        for task in self.handlers:  # a drip still going after the fetcher hung up
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        await super().close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        pem = self.site.tmp / "node-9-client.pem"
        self.site.ca.client("node-9").write_pair(pem, pem)
        context = ssl.create_default_context(cafile=str(self.site.ca_file))
        context.load_cert_chain(pem)
        host, port = self.upstream.split(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port), ssl=context)
        blob_asked = asyncio.Event()

        async def upward() -> None:
            while data := await reader.read(65536):
                if data.startswith(b"GET ") and b"/blobs/" in data.split(b"\r\n", 1)[0]:
                    blob_asked.set()
                up_writer.write(data)
                await up_writer.drain()

        try:
            with contextlib.suppress(Exception):
                await asyncio.gather(upward(), self._downward(up_reader, writer, blob_asked))
        finally:
            for stream in (up_writer, writer):
                stream.close()

    async def _downward(
        self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, blob: asyncio.Event
    ) -> None:
        head, dripping = b"", False
        while data := await up_reader.read(65536):
            if dripping:
                await self._drip(writer, data)
            elif not blob.is_set():
                writer.write(data)
                await writer.drain()
            elif (end := (head := head + data).find(b"\r\n\r\n")) >= 0:
                writer.write(head[: end + 4])
                await writer.drain()
                dripping = True
                await self._drip(writer, head[end + 4 :])

    async def _drip(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        for byte in data:  # a byte a second, as long as the fetcher listens
            writer.write(bytes([byte]))
            await writer.drain()
            self.dripped += 1
            await asyncio.sleep(1.0)


async def test_a_dripping_peer_s_blob_is_moved_to_a_healthy_peer_within_a_second_or_two(
    site: Site,
) -> None:
    honest = await site.serve("node-0", site.node_store("node-0"))
    proxy = DrippingProxy(site, honest)
    dripper = await proxy.start()
    node = fetching_node(site)
    started = asyncio.get_running_loop().time()
    try:
        with capture_logs() as logs:
            await node.look(dripper, honest)
    finally:
        await node.client.close()
        await proxy.close()
    seconds = asyncio.get_running_loop().time() - started
    assert proxy.dripped >= 1  # it was asked for a blob, and dripped
    dropped = events(logs, "bundle_fetch_peer_dropped")
    assert [(d["peer"], d["reason"]) for d in dropped] == [(dripper, "PeerTooSlow")]
    assert "moved there" in dropped[0]["error"]
    assert node.imported == [BUNDLE_ID]
    assert_store_holds_only_verified_blobs(node.store, site.bundle)
    # moved after about 1 s (straggler_s), not after the client's 5 s minimum-rate window
    assert seconds < 4.5, seconds
