"""What bench/fanout.py observes of a site node from outside: its store, its link, its
peer server, its memory and its log (read only)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bench.fanout_model import MB
from bench.prepull import cpu_s, status_kib
from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.holdings import StoreHoldings
from nodeagent.site.holdings import parse_holdings
from tests.testenv.site_node import CA_BUNDLE, CLIENT_PEM, SiteNode
from tests.testenv.waiting import log_tail, wait_for

BUNDLE_ID = "bench-fanout"
POLL_S = 0.25
IDLE_QUIET_S = 2.0
PEER_REFRESH_S = 30.0
INTEGRITY_REASONS = (
    "BundleDigestMismatch",
    "BundleSizeMismatch",
    "StoreBlobCorrupt",
    "StoreSourceMismatch",
)
"""Reason codes that mean bytes failed a digest somewhere (a lying peer, a damaged store)."""


class BenchError(RuntimeError):
    """A measured step failed or did not leave what it should have."""


def check_running(node: SiteNode) -> None:
    """A daemon that exited fails the run at once, with the end of its log."""
    if node.process is not None and node.process.poll() is not None:
        code = node.process.returncode
        raise BenchError(f"nodeagent on {node.name} exited {code}:\n{log_tail(node.log_path)}")


@dataclass
class Watch:
    """One node's store, polled: its first byte of the bundle and when it held all of it."""

    node: SiteNode
    blobs: dict[str, int]
    first_byte_s: float | None = None
    complete_s: float | None = None
    bytes_held: int = 0
    half_s: float | None = None
    """When the store first held half of the bundle's bytes."""
    ninety_s: float | None = None
    """When it first held 90 % of them: ``complete_s - ninety_s`` is the fetch's tail."""
    bundle_id: str = BUNDLE_ID

    @property
    def store(self) -> Path:
        return self.node.state_dir / "store"

    def poll(self, since: float) -> None:
        if self.complete_s is not None:
            return
        now = time.monotonic() - since
        store = BlobStore(self.store)
        stored = store.stored()
        self.bytes_held = sum(size for d, size in stored.items() if d in self.blobs)
        started = self.bytes_held > 0 or any(d in self.blobs for d in store.partials())
        if self.first_byte_s is None and started:
            self.first_byte_s = now
        total = sum(self.blobs.values())
        if self.half_s is None and 2 * self.bytes_held >= total:
            self.half_s = now
        if self.ninety_s is None and 10 * self.bytes_held >= 9 * total:
            self.ninety_s = now
        if self.bytes_held == sum(self.blobs.values()):
            held = StoreHoldings(self.store).scan()
            if any(h.bundle_id == self.bundle_id and h.is_complete for h in held):
                self.complete_s = now


def link_bytes(node: SiteNode) -> tuple[int, int]:
    """Bytes the node's eth0 has sent and received so far."""
    out = subprocess.run(
        ["ip", "-n", node.host.netns, "-s", "-j", "link", "show", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    stats = json.loads(out)[0]["stats64"]
    return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])


def peer_holdings(node: SiteNode) -> dict[str, tuple[bool, str]]:
    """The node's own ``/nodeagent/v1/holdings`` over mutual TLS: bundle id -> (complete,
    manifest digest)."""
    pem, ca = node.path(CLIENT_PEM), node.path(CA_BUNDLE)
    url = f"https://{node.address}/nodeagent/v1/holdings"
    cmd = [*node.host.exec_prefix, "curl", "-sS", "--fail", "--max-time", "20"]
    cmd += ["--cert", str(pem), "--key", str(pem), "--cacert", str(ca), url]
    done = subprocess.run(cmd, capture_output=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"{node.name}: holdings: {done.stderr.decode(errors='replace')}")
    holdings = parse_holdings(done.stdout)
    return {b.bundle_id: (b.is_complete, b.manifest_digest) for b in holdings.bundles}


def idle_rss_mib(nodes: list[SiteNode], *, timeout_s: float = 30.0) -> float:
    """The largest VmRSS of the store-only daemons once none spent CPU for 2 s (or at the
    deadline: a fetcher polling its peers is never fully still)."""
    pids = [n.process.pid for n in nodes if n.process is not None]
    deadline, last = time.monotonic() + timeout_s, [-1.0] * len(pids)
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        now = [cpu_s(p) for p in pids]
        if any(b - a > 0.02 for a, b in zip(last, now, strict=True)):
            quiet_since = time.monotonic()
        last = now
        if time.monotonic() - quiet_since >= IDLE_QUIET_S:
            break
        time.sleep(0.2)
    return max(status_kib(p, "VmRSS") / 1024 for p in pids) if pids else 0.0


def log_count(node: SiteNode, needles: tuple[str, ...]) -> int:
    """How many times the node's log (every run of it) names one of ``needles``."""
    log = node.log_path.read_text(errors="replace") if node.log_path.exists() else ""
    return sum(log.count(needle) for needle in needles)


def integrity_events(node: SiteNode) -> int:
    return log_count(node, INTEGRITY_REASONS)


def peer_drops(node: SiteNode) -> int:
    """Peers the node's fetcher dropped for a bundle (any reason: slow, failed, lying)."""
    return log_count(node, ("bundle_fetch_peer_dropped",))


def wait_all(
    watches: list[Watch],
    since: float,
    timeout_s: float,
    on_poll: Callable[[], None] | None = None,
    also: list[Watch] | None = None,
) -> None:
    """Poll until every watch's store holds the bundle; ``also``: polled too, not waited
    for (the peers while node 0 copies its stick: they may start before it ends);
    ``on_poll`` runs at each round."""
    deadline = since + timeout_s
    while any(w.complete_s is None for w in watches):
        for w in [*watches, *(also or [])]:
            w.poll(since)
            check_running(w.node)
        if on_poll is not None:
            on_poll()
        if time.monotonic() > deadline:
            left = [
                f"{w.node.name} {w.bytes_held / MB:.0f} MB" for w in watches if not w.complete_s
            ]
            raise BenchError(f"not every node holds the bundle after {timeout_s:.0f} s: {left}")
        time.sleep(POLL_S)


def _holdings_text(node: SiteNode) -> str:
    return repr(peer_holdings(node))


def check_end(nodes: list[SiteNode], bundle_id: str = BUNDLE_ID) -> None:
    """Every node's peer server says complete, all with one manifest digest (a server reads
    the store again at most every second: docs/site.md)."""
    digests = set()
    for node in nodes:

        def held(node: SiteNode = node) -> tuple[bool, str] | None:
            found = peer_holdings(node).get(bundle_id)
            return found if found is not None and found[0] else None

        _complete, digest = wait_for(
            held,
            timeout_s=PEER_REFRESH_S,
            interval_s=0.5,
            what=f"{node.name}'s peer server to say it holds {bundle_id}",
            detail=partial(_holdings_text, node),
        )
        digests.add(digest)
    if len(digests) != 1:
        raise BenchError(f"the nodes hold different manifests: {sorted(digests)}")
