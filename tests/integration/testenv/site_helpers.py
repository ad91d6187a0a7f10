"""What the multi-node tests share: a started site network (the test skipped where this
machine cannot make one), and cluster Nodes that carry each host's address."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import pytest

from tests.testenv.kube import KubeCluster
from tests.testenv.site_net import SiteHost, SiteNetUnavailable, SiteNetwork


@contextlib.contextmanager
def started_network(count: int, *, rate_mbit: float | None = None) -> Iterator[SiteNetwork]:
    """``count`` hosts on a bridge, removed after; skips the test where namespaces, veth
    pairs or ``tc`` are not available here (docs/testing.md, "The site network")."""
    network = SiteNetwork(count, rate_mbit=rate_mbit)
    try:
        network.start()
    except SiteNetUnavailable as exc:
        network.stop()
        pytest.skip(str(exc))
    try:
        yield network
    finally:
        network.stop()


def create_addressed_nodes(
    kube: KubeCluster,
    named: Iterable[tuple[str, SiteHost]],
    labels: dict[str, dict[str, str]] | None = None,
) -> None:
    """A Node per ``(name, host)``, its InternalIP the host's address (as the kubelet
    reports it), with ``labels[name]`` if given."""
    for name, host in named:
        kube.create_node(name, (labels or {}).get(name))
        kube.set_internal_address(name, host.address)
