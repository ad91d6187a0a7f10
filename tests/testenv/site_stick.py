"""A site with one stick: node namespaces on a bridge, the stick's udevd in node 0's alone.

``stick_site(workdir, n)`` starts ``n`` node namespaces (``site_net.SiteNetwork``) and the
node udevd inside node 0's (``site_node.stick_udevd``, ``tests/testenv/node_udevd.py``): a
loop device attached while it runs is node 0's stick, no other node hears of it, whether or
not the machine runs a udevd of its own. It raises ``SiteNetUnavailable`` when this machine
has no network namespaces; the tests skip then, naming the probe, and the demo says so.
``fanout_nodes`` lays out nodes that each serve their store to the others (``[site]
peers``), each with its own CRI-O, trusting the factory's key: the shape of the site
fan-out tests and of ``make demo``'s last step.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.testenv.agent import set_state
from tests.testenv.node_udevd import NodeUdevd
from tests.testenv.site_net import SiteNetUnavailable, SiteNetwork
from tests.testenv.site_node import SITE_PORT, SiteNode, stick_udevd
from tests.testenv.site_pki import Issued


@contextmanager
def stick_site(workdir: Path, n: int, *, rate_mbit: float | None = None) -> Iterator[SiteNetwork]:
    """``n`` node namespaces (links of ``rate_mbit`` each way, unshaped when None) and node
    0's stick udevd, both stopped on exit."""
    with stick_site_udevd(workdir, n, rate_mbit=rate_mbit) as (network, _):
        yield network


@contextmanager
def stick_site_udevd(
    workdir: Path, n: int, *, rate_mbit: float | None = None
) -> Iterator[tuple[SiteNetwork, NodeUdevd]]:
    """``stick_site``, with its udevd: ``udevd.move(host.exec_prefix)`` hands the stick to
    another node (the nodes that may have it are made with ``stick_nodes``)."""
    network = SiteNetwork(n, rate_mbit=rate_mbit)
    try:
        network.start()
        udevd = stick_udevd(workdir / "udevd", network.hosts[0])
    except SiteNetUnavailable:
        network.stop()
        raise
    try:
        with udevd:
            yield network, udevd
    finally:
        network.stop()


def fanout_nodes(
    workdir: Path,
    network: SiteNetwork,
    ca: Issued,
    public_key: str,
    *,
    stick_nodes: Collection[int] = (0,),
) -> list[SiteNode]:
    """One node per host (not started), each with CRI-O, serving its store to all the others;
    the nodes of ``stick_nodes`` (node 0) watch for media and read the live udev database."""
    addresses = [f"{h.address}:{SITE_PORT}" for h in network.hosts]
    return [
        SiteNode(
            workdir / f"node-{h.index}",
            h,
            name=f"node-{h.index}",
            ca=ca,
            peers=[a for i, a in enumerate(addresses) if i != h.index],
            with_crio=True,
            has_stick=h.index in stick_nodes,
            trusted_keys=[public_key],
        )
        for h in network.hosts
    ]


def start_fanout(nodes: list[SiteNode]) -> None:
    """Start every node: the one with the stick until it watches for media."""
    for node in nodes:
        node.start(ready="media_watch_started" if node.has_stick else "daemon_started")


def bundle_pinned(status: dict[str, Any], set_name: str) -> bool:
    """A bundle reported ``pinned`` and its set ``Pinned``."""
    states = [b.get("state") for b in status.get("bundles", [])]
    return "pinned" in states and set_state(status, set_name) == "Pinned"
