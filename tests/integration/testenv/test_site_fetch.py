"""One stick for the site: plugged into node 0 only, all three nodes end with the bundle pinned.

Three node namespaces, each with its own CRI-O and ``nodeagent run`` serving its store
(``[site] serve = true``) with the two others as static ``[site] peers`` (so it follows,
``follow = auto``). The stick is a loop device only node 0 sees (``tests/testenv/
site_node.py``). Node 0 copies it into its store and imports it; nodes 1 and 2 fetch it
from their peers (node 0, and each other as soon as they hold blobs), verify every blob
and the signature against their own keys, import it from their stores through their own
loopback mirror and pin it. The medium is read by node 0 alone, once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.testenv.bundles import build_factory, ext4_media
from tests.testenv.site_net import SiteNetUnavailable, SiteNetwork
from tests.testenv.site_pki import make_ca
from tests.testenv.site_stick import bundle_pinned, fanout_nodes, start_fanout, stick_site

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def three_nodes(tmp_path: Path) -> Iterator[SiteNetwork]:
    with contextlib.ExitStack() as stack:
        try:
            network = stack.enter_context(stick_site(tmp_path, 3))
        except SiteNetUnavailable as exc:
            pytest.skip(str(exc))
        yield network


@pytest.mark.timeout(420)
def test_a_stick_in_node_0_ends_pinned_on_all_three_nodes_the_medium_read_once(
    tmp_path: Path,
) -> None:
    factory = build_factory(tmp_path / "factory", count=2, layer_bytes=1 << 20, seed=21)
    ca = make_ca("site CA")
    with three_nodes(tmp_path) as net:
        nodes = fanout_nodes(tmp_path, net, ca, factory.public_key)
        with ext4_media(tmp_path, factory.bundle) as media:
            try:
                start_fanout(nodes)
                media.attach()
                for node in nodes:
                    status = node.wait_status(
                        lambda s: bundle_pinned(s, factory.set_name),
                        what="the bundle pinned",
                        timeout_s=300,
                    )
                    (entry,) = [b for b in status["bundles"] if b["state"] == "pinned"]
                    assert entry["images"] == {"total": 2, "present": 2}
                logs = [node.current_run_log() for node in nodes]
                # the medium: mounted and copied by node 0 alone, once
                assert logs[0].count("store_copy_started") == 1
                assert "bundle_fetched" not in logs[0]
                for log in logs[1:]:
                    assert "bundle_media_detected" not in log
                    assert "store_copy_started" not in log
                    assert log.count("bundle_fetched:") == 1
                    assert "bundle_fetch_peer_dropped" not in log
                    assert "bundle_imported" in log
            finally:
                for node in nodes:
                    node.close()
