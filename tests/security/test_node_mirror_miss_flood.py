"""Attack: a local process asks the node mirror for digest after digest that nobody holds,
to make the site fetcher hammer the peers.

Decision 0061: a digest the node mirror lacks wakes the daemon's site fetcher, which then
looks at its peers (one holdings request per static peer) before its poll. A local
unprivileged process reaches the mirror (loopback, no credential needed to miss), so it
could turn each request into a look at every peer of the site. It cannot: the peer process
reports at most 32 misses per 15 s, the wake-ups coalesce, and woken looks come at least
``MIN_LOOK_GAP_S`` (1 s) apart.

Against real processes in a network namespace (``site_net``, ``site_node``): the node's
daemon and unprivileged peer process, one static peer (``lying_peer.py``, holding nothing:
it only counts the holdings requests), and a client in the node's namespace that asks for
a new random digest every 0.2 s for ``FLOOD_S``. Without the gap that is about 3 looks a
second while the reports last; the test allows one a second plus the poll's.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodeagent.daemon.fetching import MIN_LOOK_GAP_S
from tests.integration.testenv.site_helpers import started_network
from tests.testenv.lying_peer import ScriptedPeer
from tests.testenv.signed_bundles import Keys, image, signed_bundle
from tests.testenv.site_node import SITE_PORT, SiteNode
from tests.testenv.site_pki import issue_node_cert, make_ca, write_ca, write_pem_bundle
from tests.testenv.waiting import wait_for

FLOOD_S = 8.0
EVERY_S = 0.2
CLIENT = """
import http.client, os, sys, time
port, seconds, every = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
end, sent = time.monotonic() + seconds, 0
while time.monotonic() < end:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/v2/site/none/manifests/sha256:" + os.urandom(32).hex())
    status = conn.getresponse().status
    conn.close()
    assert status == 404, status
    sent += 1
    time.sleep(every)
print(sent)
"""


@pytest.mark.timeout(120)
def test_a_flood_of_missing_digests_wakes_the_fetcher_once_a_second_at_most(
    tmp_path: Path,
) -> None:
    keys = Keys.make(tmp_path / "keys")
    ca = make_ca("site CA")
    ca_file = write_ca(tmp_path / "ca.crt", ca)
    bundle = signed_bundle(
        tmp_path / "bundle",
        keys,
        [image("site/counted", [(4096, 1)], tmp_path)],
        bundle_id="counted",
        set_name="counted",
    )
    with started_network(2) as net:
        node_host, peer_host = net.hosts
        pem = write_pem_bundle(
            tmp_path / "peer.pem", issue_node_cert(ca, "counter", [peer_host.address])
        )
        counter = ScriptedPeer(
            tmp_path / "peer", [bundle.root], pem, ca_file, addr=peer_host.address,
            port=SITE_PORT, mode="drip", prefix=peer_host.exec_prefix,
            armed_by=tmp_path / "never",  # holds nothing: its holdings list is empty
        )  # fmt: skip
        node = SiteNode(
            tmp_path / "node", node_host, name="node", ca=ca,
            trusted_keys=[(keys.trusted_dir / "factory.pub").read_text()],
            peers=[counter.address], serve_mirror=True,
            # answered at once: this test counts the fetcher's wakes, not the holds
            # (test_a_flood_of_held_misses_holds_at_most_max_held below)
            extra_config="[mirror]\nmiss_wait_s = 0\n",
        )  # fmt: skip
        try:
            node.start()
            node.wait_log("node_mirror_started")
            node.wait_log("peer_reports_listening")
            wait_for(lambda: counter.requests("/holdings"), timeout_s=30, what="a first look")
            before = len(counter.requests("/holdings"))
            started = time.monotonic()
            done = subprocess.run(
                [*node_host.exec_prefix, sys.executable, "-c", CLIENT, "22626",
                 str(FLOOD_S), str(EVERY_S)],
                capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            seconds = time.monotonic() - started
            looks = len(counter.requests("/holdings")) - before
            log = node.current_run_log()
        finally:
            node.close()
            counter.close()
    sent = int(done.stdout.strip())
    missed = log.count("node_mirror_digest_missing")
    print(f"{sent} missing digests asked in {seconds:.1f} s: {looks} looks at the peer")
    assert missed >= 20, log  # the misses were made and reported: the attack happened
    # one woken look a gap at most, plus the poll's (2 s, -20 %) and one under way
    allowed = seconds / MIN_LOOK_GAP_S + seconds / 1.6 + 1
    assert looks <= allowed, (looks, allowed)
