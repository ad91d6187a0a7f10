"""The demo's site: three nodes, each its own network namespace, CRI-O and daemon, on one
bridge; the stick is plugged into node 0 alone and all three end with its set pinned.

The layout is the site fan-out tests' (``tests/testenv/site_stick.py``): every node serves
its store to the others over mutual TLS (a site CA issues each node's certificate) and
follows them; nodes 1 and 2 fetch the bundle from a peer, check every blob's digest and the
signature against their own trusted keys, and import it from their own stores.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.testenv.bundles import Factory, ext4_media
from tests.testenv.demo.story import Story
from tests.testenv.site_net import SiteNetUnavailable, SiteNetwork
from tests.testenv.site_node import SiteNode
from tests.testenv.site_pki import make_ca
from tests.testenv.site_stick import bundle_pinned, fanout_nodes, start_fanout, stick_site

NODES = 3
NODE_0_EVENTS = ("bundle_media_detected", "bundle_stored", "bundle_imported", "set_pinned")
PEER_EVENTS = ("bundle_fetched", "bundle_imported", "set_pinned")
SKIPPED = "site fan-out skipped"


def site_fanout(workdir: Path, story: Story, factory: Factory) -> None:
    with story.chapter(f"d. one stick, {NODES} nodes: site fan-out"):
        story.explain(
            f"""{NODES} nodes, each in its own network namespace with its own CRI-O and
            nodeagent, share a bridge. The stick goes into node 0 only; the others fetch the
            bundle from their peers, verify it themselves and pin it. No registry anywhere."""
        )
        try:
            with stick_site(workdir, NODES) as network:
                _run_site(workdir, story, factory, network)
        except SiteNetUnavailable as exc:
            story.say(f"    {SKIPPED}: {exc}")


def close_all(nodes: list[SiteNode]) -> None:
    """SIGTERM every daemon first, then wait for each and stop its CRI-O: a daemon stopped
    alone waits for its peers' open connections (up to its stop timeout, 30 s here)."""
    for node in nodes:
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGTERM)
    for node in nodes:
        node.close()


def _run_site(workdir: Path, story: Story, factory: Factory, network: SiteNetwork) -> None:
    nodes = fanout_nodes(workdir, network, make_ca("site CA"), factory.public_key)
    with ext4_media(workdir, factory.bundle) as stick:
        try:
            started = time.monotonic()
            start_fanout(nodes)
            story.say(
                f"    {NODES} CRI-Os and daemons started in {time.monotonic() - started:.1f} s:"
            )
            story.say("      " + ", ".join(f"{n.name} at {n.address}" for n in nodes))
            plugged = time.monotonic()
            story.say(f"    stick plugged into node-0: {stick.attach()}")
            for node in nodes:
                node.wait_status(
                    lambda s: bundle_pinned(s, factory.set_name), what="the bundle pinned"
                )
                since = time.monotonic() - plugged
                story.say(
                    f"    {node.name}: {factory.set_name} pinned, {since:.1f} s after the stick"
                )
            for node, events in zip(nodes, (NODE_0_EVENTS, PEER_EVENTS, PEER_EVENTS), strict=True):
                story.journal(node.current_run_log(), events, who=node.name)
            story.milestone(f"{NODES} nodes pinned from one stick")
        finally:
            stick.unplug()
            close_all(nodes)
