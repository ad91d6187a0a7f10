"""Attack: a node with a valid certificate lies to the site's fan-out, or drips.

docs/site.md said one node cannot stall the fan-out; issue 24 (finding 3) showed it could:
the fetcher offered only the manifest digest most peers held and broke a 1:1 tie by the
largest digest, so a node publishing the bundle id under a fake digest won, failed the
signature check and the honest digest was never tried; a peer sending a byte every 59 s
held ``look()`` and the refresh for ever; a lying ``uploads.active = 0`` made it
preferred; the memos grew without bound. Each test here performs one of those moves with a
scripted peer (``tests/testenv/lying_peer.py``: a process holding a certificate of the
site's CA, speaking the peer protocol over real mutual TLS) against real daemons in
network namespaces (``site_net``, ``site_node``), store-only (the import from the store
is the stick's, tested elsewhere), and shows it fails:

* a fake manifest digest that wins the tie: the honest node still fetches and stores the
  bundle, the liar is demoted and never asked for that manifest again;
* a dripping peer that says it is idle: it is cut after the minimum-rate window, the fetch
  completes from the others, and the next bundle asks it for nothing;
* a peer inventing 4096 bundle ids with new digests at every look: the fetcher asks it for
  one manifest, then never again while it is demoted, and its tables stay bounded;
* the figure (``security_long``): fan-out time with one lying and one dripping peer over
  the time without them, same sizes, same run: at most 1.2.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.adapters.http.client import PeerClient, RequestBounds
from nodeagent.adapters.http.tls import ReloadingClientTls
from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import StoreLimits, copy_bundle
from nodeagent.adapters.store.fetched import FetchStore
from nodeagent.site.discovery import PeerView
from nodeagent.site.fetcher import MAX_DIGESTS, BundleFetcher
from nodeagent.site.fetching import SignedBundle
from nodeagent.site.follow import NodeFacts
from nodeagent.site.imports import MAX_MEMO
from nodeagent.site.standing import MAX_PEERS
from nodeagent.site.transfer import FetcherPorts
from nodeagent.status import BundleReport
from nodeagent.store import layout
from tests.integration.testenv.site_helpers import started_network
from tests.testenv.lying_peer import ScriptedPeer
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle
from tests.testenv.site_net import SiteHost, SiteNetwork
from tests.testenv.site_node import SITE_PORT, SiteNode
from tests.testenv.site_pki import Issued, issue_node_cert, make_ca, write_ca, write_pem_bundle
from tests.testenv.waiting import log_tail, wait_for

MIB = 1 << 20


@dataclass
class Kit:
    tmp: Path
    keys: Keys
    ca: Issued
    ca_file: Path

    @property
    def public_key(self) -> str:
        return (self.keys.trusted_dir / "factory.pub").read_text()

    def bundle(
        self, bundle_id: str, layers: list[tuple[int, int]], created: str = "2026-01-01T00:00:00Z"
    ) -> Signed:
        images = [image(f"site/{bundle_id}", layers, self.tmp / "layers")]
        return signed_bundle(
            self.tmp / bundle_id, self.keys, images, bundle_id=bundle_id, set_name=bundle_id,
            created=created,
        )  # fmt: skip

    def scripted(
        self,
        host: SiteHost | None,
        bundles: list[Signed],
        mode: str,
        name: str,
        *,
        port: int = SITE_PORT,
        armed_by: Path | None = None,
        drip_s: float = 2.0,
    ) -> ScriptedPeer:
        addr = host.address if host is not None else "127.0.0.1"
        pem = write_pem_bundle(self.tmp / f"{name}.pem", issue_node_cert(self.ca, name, [addr]))
        return ScriptedPeer(
            self.tmp / name,
            [b.root for b in bundles],
            pem,
            self.ca_file,
            addr=addr,
            port=port,
            mode=mode,
            prefix=host.exec_prefix if host is not None else None,
            armed_by=armed_by,
            drip_s=drip_s,
        )


@pytest.fixture
def kit(tmp_path: Path) -> Kit:
    ca = make_ca("site CA")
    return Kit(tmp_path, Keys.make(tmp_path / "keys"), ca, write_ca(tmp_path / "ca.crt", ca))


def nodes_of(kit: Kit, net: SiteNetwork, count: int, extra: list[str], tag: str) -> list[SiteNode]:
    """``count`` store-only nodes on the first hosts: node 0 the source (no peers: it does
    not follow), each other one with the others and ``extra`` as its static peers."""
    addresses = [f"{h.address}:{SITE_PORT}" for h in net.hosts[:count]]
    return [
        SiteNode(
            kit.tmp / f"{tag}-node-{h.index}",
            h,
            name=f"node-{h.index}",
            ca=kit.ca,
            peers=[a for a in addresses if a != addresses[h.index]] + extra if h.index else [],
            trusted_keys=[kit.public_key],
        )
        for h in net.hosts[:count]
    ]


def store_of(node: SiteNode) -> Path:
    return node.state_dir / "store"


def assert_verified_copy(node: SiteNode, bundle: Signed) -> None:
    blobs = BlobStore(store_of(node))
    assert set(blobs.stored()) >= set(bundle.manifest.blobs)
    for digest in bundle.manifest.blobs:
        data = blobs.path(digest).read_bytes()
        assert f"sha256:{hashlib.sha256(data).hexdigest()}" == digest
    record = store_of(node) / layout.bundle_dir(bundle.manifest.bundle_id) / layout.RECORD_NAME
    assert record.is_file()


def fetched(node: SiteNode, bundle_id: str) -> bool:
    return f"bundle_fetched: bundle={bundle_id}" in node.current_run_log()


@contextlib.contextmanager
def closing_all(*items: SiteNode | ScriptedPeer) -> Iterator[None]:
    try:
        yield
    finally:
        for item in items:
            item.close()


@pytest.mark.timeout(180)
def test_a_fake_manifest_digest_that_wins_the_tie_does_not_stop_the_fetch(kit: Kit) -> None:
    bundle = kit.bundle("site-liar", [(MIB, 1), (MIB, 2)])
    with started_network(3) as net:
        liar = kit.scripted(net.hosts[2], [bundle], "fake-digest", "liar")
        nodes = nodes_of(kit, net, 2, [liar.address], "a")
        copy_bundle(store_of(nodes[0]), bundle.root, bundle.manifest, kit.keys.trusted_dir)
        with closing_all(liar, *nodes):
            holdings = liar.requests()  # none yet
            for node in nodes:
                node.start()
            fetcher = nodes[1]
            wait_for(
                lambda: fetched(fetcher, "site-liar"), timeout_s=90, what="node 1 fetching",
                detail=lambda: log_tail(fetcher.log_path),
            )  # fmt: skip
            assert_verified_copy(fetcher, bundle)
            # two more looks of node 1 at the liar after the fetch: no manifest asked again
            holdings = liar.requests("/holdings")
            wait_for(
                lambda: len(liar.requests("/holdings")) >= len(holdings) + 2,
                timeout_s=30, what="two more looks at the liar",
            )  # fmt: skip
            log = fetcher.current_run_log()
    honest = f"sha256:{hashlib.sha256((bundle.root / 'bundle.json').read_bytes()).hexdigest()}"
    asked = liar.manifests_asked(by=fetcher.host.address)
    assert len(asked) <= 1, asked  # at most once (0: the honest copy came first, then held)
    if asked:  # the liar's copy was tried first (a coin toss): it was refused and demoted
        assert re.search(rf"peer_demoted: .*peer={re.escape(liar.address)}", log), log
        assert "reason=BundleSignatureInvalid" in log
    assert f"manifest={honest}" not in " ".join(re.findall(r"peer_demoted: .*", log))
    assert "bundle_fetch_peer_dropped" not in log


@pytest.mark.timeout(240)
def test_a_dripping_peer_that_says_it_is_idle_is_cut_and_not_asked_again(kit: Kit) -> None:
    first = kit.bundle("site-drip-1", [(MIB, 11), (MIB, 12), (MIB, 13), (MIB, 14)])
    second = kit.bundle("site-drip-2", [(MIB, 21), (MIB, 22)], "2026-01-02T00:00:00Z")
    with started_network(3, rate_mbit=32) as net:
        dripper = kit.scripted(net.hosts[2], [first, second], "drip", "dripper")
        nodes = nodes_of(kit, net, 2, [dripper.address], "b")
        copy_bundle(store_of(nodes[0]), first.root, first.manifest, kit.keys.trusted_dir)
        with closing_all(dripper, *nodes):
            for node in nodes:
                node.start()
            fetcher = nodes[1]
            started = time.monotonic()
            wait_for(
                lambda: fetched(fetcher, "site-drip-1"), timeout_s=60, what="node 1 fetching",
                detail=lambda: log_tail(fetcher.log_path),
            )  # fmt: skip
            seconds = time.monotonic() - started
            assert_verified_copy(fetcher, first)
            log = fetcher.current_run_log()
            asked_first = dripper.requests("/blobs/")
            # the next bundle: the dripper is demoted, the source has every blob
            copy_bundle(store_of(nodes[0]), second.root, second.manifest, kit.keys.trusted_dir)
            wait_for(
                lambda: fetched(fetcher, "site-drip-2"), timeout_s=60, what="the second bundle",
                detail=lambda: log_tail(fetcher.log_path),
            )  # fmt: skip
            asked_second = dripper.requests("/blobs/")[len(asked_first) :]
            log2 = fetcher.current_run_log()
    print(f"dripping peer: fetch of 4 MiB done in {seconds:.1f} s, blobs asked {asked_first}")
    # it was preferred at first (uploads.active = 0, nothing measured yet), then cut
    assert asked_first, "the dripper was never asked: the attack did not happen"
    assert re.search(
        rf"bundle_fetch_peer_dropped: .*peer={re.escape(dripper.address)}.*reason=PeerTooSlow", log
    ), log
    assert len(asked_first) <= 2  # two at once per peer, then dropped
    assert asked_second == [], log2  # demoted: not asked while the source has the blobs
    assert seconds < 40  # 59 s a byte held it for ever before; 5 s windows now


@pytest.mark.timeout(180)
def test_a_peer_dripping_its_holdings_holds_no_look(kit: Kit) -> None:
    """The static peers' holdings are asked each on its own: a look waits 3 s at most for
    a peer that sends them a byte every 2 s, then goes on with the others (it waited for
    all of them, for ever, before)."""
    bundle = kit.bundle("site-drip-looks", [(MIB, 31), (MIB, 32)])
    with started_network(3) as net:
        dripper = kit.scripted(net.hosts[2], [bundle], "drip-all", "dripper")
        nodes = nodes_of(kit, net, 2, [dripper.address], "c")
        copy_bundle(store_of(nodes[0]), bundle.root, bundle.manifest, kit.keys.trusted_dir)
        with closing_all(dripper, *nodes):
            for node in nodes:
                node.start()
            started = time.monotonic()
            wait_for(
                lambda: fetched(nodes[1], "site-drip-looks"),
                timeout_s=60,
                what="node 1 fetching past the dripping holdings",
                detail=lambda: log_tail(nodes[1].log_path),
            )
            seconds = time.monotonic() - started
    assert dripper.requests("/holdings"), "the dripper was never asked: no attack happened"
    assert dripper.requests("/bundle.json") == []  # it never got to offer anything
    assert seconds < 30, seconds


def loopback_fetcher(kit: Kit, store: Path) -> tuple[BundleFetcher, PeerClient]:
    pem = write_pem_bundle(kit.tmp / "fetcher.pem", issue_node_cert(kit.ca, "fetcher", []))
    client = PeerClient(
        ReloadingClientTls(pem, pem, kit.ca_file),
        request_timeout_s=5,
        bounds=RequestBounds(head_s=5.0),
    )
    fetch_store = FetchStore(store, kit.keys.trusted_dir, StoreLimits())

    def facts(held: dict[str, str]) -> NodeFacts:
        return NodeFacts("on", False, True, "amd64", None, held)

    async def import_bundle(signed: SignedBundle, source: str) -> BundleReport:
        return BundleReport(source, "imported", bundle_id=signed.manifest.bundle_id)

    ports = FetcherPorts(client, fetch_store, facts, import_bundle)
    return BundleFetcher(ports, concurrency=4, rng=random.Random(5)), client  # noqa: S311


async def test_a_peer_inventing_digests_gets_one_manifest_asked_and_bounded_tables(
    kit: Kit,
) -> None:
    bundle = kit.bundle("site-many", [(4096, 1)])
    liar = kit.scripted(None, [bundle], "many-fakes", "inventor", port=0)
    fetcher, client = loopback_fetcher(kit, kit.tmp / "fetcher-store")
    tables: list[Callable[[], int]] = [
        lambda: len(fetcher._memo),
        lambda: len(fetcher._failed_from),
        lambda: len(fetcher._verified),
        lambda: len(fetcher._bad),
        lambda: len(fetcher.standings),
    ]
    try:
        for _ in range(3):
            await fetcher.look([PeerView(liar.address)])
    finally:
        await fetcher.close()
        await client.close()
        liar.close()
    assert len(liar.requests("/holdings")) == 3, liar.log_path.read_text()  # looked at 3 times
    # 3 x 4096 invented digests offered; one manifest asked, then the liar demoted
    assert len(liar.manifests_asked()) == 1, liar.manifests_asked()
    sizes = [table() for table in tables]
    assert all(size <= max(MAX_MEMO, MAX_DIGESTS, MAX_PEERS) for size in sizes), sizes
    assert sizes == [1, 1, 0, 0, 1], sizes


def fan_out_seconds(
    kit: Kit, net: SiteNetwork, bundle: Signed, extra: list[str], tag: str
) -> tuple[float, list[str]]:
    """Node 0 gets ``bundle`` in its store once every node runs (and the scripted peers
    start offering it: ``kit.tmp / "armed"``); the seconds until nodes 1-3 all fetched it
    (their own daemons, from node 0 and each other, and ``extra``), and their logs."""
    nodes = nodes_of(kit, net, 4, extra, tag)
    bundle_id = bundle.manifest.bundle_id
    with closing_all(*nodes):
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait_listening()
        started = time.monotonic()
        (kit.tmp / "armed").touch()
        copy_bundle(store_of(nodes[0]), bundle.root, bundle.manifest, kit.keys.trusted_dir)
        for node in nodes[1:]:
            wait_for(
                lambda node=node: fetched(node, bundle_id),  # type: ignore[misc]
                timeout_s=240,
                interval_s=0.1,
                what=f"{node.name} fetching ({tag})",
                detail=lambda node=node: log_tail(node.log_path),  # type: ignore[misc]
            )
        seconds = time.monotonic() - started
        for node in nodes[1:]:
            assert_verified_copy(node, bundle)
        return seconds, [node.current_run_log() for node in nodes[1:]]


@pytest.mark.security_long
@pytest.mark.timeout(900)
def test_the_fan_out_with_a_liar_and_a_dripper_takes_at_most_1_2_times_as_long(kit: Kit) -> None:
    """One source, three fetching nodes, 16 Mbit/s links, a 32 MiB bundle of 16 blobs; the
    attacked run (a liar publishing the bundle under a fake digest that wins the old tie,
    and a dripper saying it is idle and sending a byte every 2 s) first, then the same
    fan-out without them, on fresh stores in the same network."""
    layers = [(2 * MIB, 100 + i) for i in range(16)]
    bundle = kit.bundle("site-fanout", layers)
    with started_network(6, rate_mbit=16) as net:
        armed = kit.tmp / "armed"
        liar = kit.scripted(net.hosts[4], [bundle], "fake-digest", "liar", armed_by=armed)
        dripper = kit.scripted(net.hosts[5], [bundle], "drip", "dripper", armed_by=armed)
        with closing_all(liar, dripper):
            attacked, logs = fan_out_seconds(
                kit, net, bundle, [liar.address, dripper.address], "attacked"
            )
        clean, _ = fan_out_seconds(kit, net, bundle, [], "clean")
    ratio = attacked / clean
    print(
        f"fan-out of 32 MiB to 3 nodes at 16 Mbit/s: {clean:.1f} s without, {attacked:.1f} s "
        f"with a lying and a dripping peer: {ratio:.2f}x; dripper asked for "
        f"{len(dripper.requests('/blobs/'))} blobs, liar for "
        f"{len(liar.manifests_asked())} manifests"
    )
    assert dripper.requests("/blobs/"), "the dripper was never asked: no attack happened"
    assert any(f"peer={dripper.address} reason=PeerTooSlow" in log for log in logs), logs
    assert ratio <= 1.2
