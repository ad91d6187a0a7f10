"""Drill: a peer answers 1 byte a second while the other is healthy (issue 30 item 5).

Three hosts in network namespaces on 100 Mbit/s links: node 0 holds a 64 MiB bundle of 4
blobs, node 1 follows it (a real daemon, store-only), and a scripted peer with a valid
node certificate (``tests/testenv/lying_peer.py``, mode ``drip``) publishes the same bundle,
says it is idle (so it is asked first) and sends each blob one byte a second. The same
fetch runs without the dripper first, on a fresh store, as the baseline of the same run.

Proves: the fetch beside the dripper ends within 1.2x the healthy time, and the dripper is
dropped as a straggler: a request under the client's minimum rate and far slower than
another peer's is moved after 1 s (``transfer.FetchRun.check_stragglers``) and its blob
resumed from the healthy peer where it stopped. Measured here: 1.03x (1.09x with the move
turned off: at this size the other blobs keep the link busy while the dripper holds one for
its 5 s window; with 2 blobs of 4 MiB it was 2.56x without the move, 1.60x with it).
About 30 s.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nodeagent.adapters.store.copier import copy_bundle
from tests.integration.testenv.site_helpers import started_network
from tests.security.test_lying_peers import (
    MIB,
    Kit,
    assert_verified_copy,
    closing_all,
    fetched,
    nodes_of,
    store_of,
)
from tests.testenv.signed_bundles import Keys, Signed
from tests.testenv.site_net import SiteNetwork
from tests.testenv.site_pki import make_ca, write_ca
from tests.testenv.waiting import log_tail, wait_for

pytestmark = [pytest.mark.drill, pytest.mark.needs("site-net")]


@pytest.fixture
def kit(tmp_path: Path) -> Kit:
    """The site's CA and bundle keys, as tests/security/test_lying_peers.py makes them."""
    ca = make_ca("site CA")
    return Kit(tmp_path, Keys.make(tmp_path / "keys"), ca, write_ca(tmp_path / "ca.crt", ca))


def fetch_seconds(
    kit: Kit, net: SiteNetwork, bundle: Signed, extra: list[str], tag: str
) -> tuple[float, str]:
    """Node 1 follows node 0 (and ``extra``); the seconds from node 0 storing ``bundle``
    to node 1 having fetched it, and node 1's log."""
    nodes = nodes_of(kit, net, 2, extra, tag)
    bundle_id = bundle.manifest.bundle_id
    with closing_all(*nodes):
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait_listening()
        started = time.monotonic()
        (kit.tmp / "armed").touch()
        copy_bundle(store_of(nodes[0]), bundle.root, bundle.manifest, kit.keys.trusted_dir)
        wait_for(
            lambda: fetched(nodes[1], bundle_id), timeout_s=120, interval_s=0.1,
            what=f"node 1 fetching ({tag})", detail=lambda: log_tail(nodes[1].log_path),
        )  # fmt: skip
        seconds = time.monotonic() - started
        assert_verified_copy(nodes[1], bundle)
        return seconds, nodes[1].current_run_log()


@pytest.mark.timeout(300)
def test_dripping_peer(kit: Kit) -> None:
    """A peer dripping a byte a second costs at most a fifth of the fetch."""
    bundle = kit.bundle("site-drip-drill", [(16 * MIB, 300 + i) for i in range(4)])
    with started_network(3, rate_mbit=100) as net:
        healthy, _ = fetch_seconds(kit, net, bundle, [], "h")
        (kit.tmp / "armed").unlink()
        armed = kit.tmp / "armed"
        dripper = kit.scripted(
            net.hosts[2], [bundle], "drip", "dripper", armed_by=armed, drip_s=1.0
        )
        with closing_all(dripper):
            dripping, log = fetch_seconds(kit, net, bundle, [dripper.address], "d")
            asked = dripper.requests("/blobs/")
    ratio = dripping / healthy
    print(
        f"64 MiB in 4 blobs at 100 Mbit/s: {healthy:.1f} s healthy, {dripping:.1f} s beside a peer "
        f"dripping 1 byte/s: {ratio:.2f}x; the dripper was asked for {len(asked)} blobs"
    )
    assert asked, "the dripper was never asked: the drill did not happen"
    assert f"peer={dripper.address} reason=PeerTooSlow" in log, log
    assert "moved there" in log, log
    assert ratio <= 1.2
