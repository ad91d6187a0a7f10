"""Drill: a node's wall clock steps an hour forward and back (issue 30 item 5).

The steps are the daemon's alone: its process runs with libfaketime
(``tests/testenv/faketime.py``), whose offset file the test rewrites mid-run; its monotonic
clocks stay the kernel's, as on a node whose NTP client steps the clock. The host's clock,
which etcd, the certificates and every other process here depend on, is never touched.

* **During a fetch** (two store-only nodes in network namespaces at 20 Mbit/s, node 1
  following node 0's bundle of four 8 MiB layers): node 1's clock steps an hour forward at a
  quarter of the bytes, back at half, forward again at three quarters. The fetch ends with
  no peer dropped or demoted, no stall, no timeout, no retry; the rates and elapsed times
  the status file showed on the way are those of the link, never of the step; the
  ``bundle_fetched`` seconds are the real ones; and the record it wrote says it was
  accepted an hour ahead (the proof that the daemon's clock did step).
* **Around a bundle's ``expires``** (``bundle create --expires 30m``; node 1 with CRI-O,
  node 2 store-only, both following node 0): node 1 fetches, imports and pins the bundle;
  its clock steps an hour forward, past ``expires``, and its daemon restarts: its sync keeps
  the set pinned and the CRI-O pin file unchanged, as docs/bundle-format.md says (``expires``
  is judged when a bundle enters; a pin made before is never dropped by it). A new import
  is refused with ``BundleExpired`` naming both times (the bundle's ``expires`` and the
  node's clock): by the daemon of node 2, whose clock is an hour ahead too
  (``bundle_not_followed`` reason ``Expired``), and by hand on node 1 (``bundle import``,
  the daemon stopped first as it asks). Each clock stepped back an hour, the bundle is
  taken: node 2 fetches it (after a restart: a bundle skipped is looked at again only after
  the fetcher's ``recheck_s``, 300 s), node 1's import by hand is taken and the set stays
  pinned.

The fetch drill takes 19-25 s, the expiry drill 18-26 s (call phase, this 2-core machine,
four runs each, some beside other helpers' tests; 26 and 52 s at a load average of 5).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import copy_bundle, read_signed
from nodeagent.bundles.manifest import BundleManifest
from nodeagent.store import layout
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
from tests.testenv.bundles import Factory, build_factory
from tests.testenv.faketime import FakeClock
from tests.testenv.signed_bundles import Keys
from tests.testenv.site_net import SiteNetwork
from tests.testenv.site_node import SITE_PORT, SiteNode
from tests.testenv.site_pki import make_ca, write_ca
from tests.testenv.site_stick import bundle_pinned
from tests.testenv.waiting import log_tail, wait_for

pytestmark = [pytest.mark.drill, pytest.mark.needs("site-net")]

HOUR_S = 3600
RATE_MBIT = 20.0
TROUBLE = (
    "bundle_fetch_peer_dropped",
    "peer_demoted",
    "bundle_fetch_failed",
    "bundle_fetch_refused",
    "fetch_task_failed",
    "NoPeerLeft",
    "PeerTooSlow",
    "Timeout",
    "timed out",
    "BundleExpired",
)
"""What a step taken for elapsed time would cause: a peer judged slow or stalled, a timeout
fired early, a retry."""


@pytest.fixture
def kit(tmp_path: Path) -> Kit:
    ca = make_ca("site CA")
    return Kit(tmp_path, Keys.make(tmp_path / "keys"), ca, write_ca(tmp_path / "ca.crt", ca))


def received_bytes(node: SiteNode) -> int:
    """Bytes of blobs the node's store holds, whole or partial."""
    blobs = BlobStore(store_of(node))
    stored = sum(blobs.stored().values()) if blobs.root.exists() else 0
    partial = sum(size for size, _ in blobs.partials().values()) if blobs.root.exists() else 0
    return stored + partial


class FetchWatch:
    """The fetch's progress as the node's status file shows it, sampled at every look."""

    def __init__(self, node: SiteNode, bundle_id: str) -> None:
        self.node, self.bundle_id = node, bundle_id
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self.started = time.monotonic()

    def look(self) -> None:
        status = self.node.status() or {}
        for report in status.get("bundles", []):
            progress = report.get("progress")
            if report.get("bundleId") != self.bundle_id or not isinstance(progress, dict):
                continue
            if not self.samples or self.samples[-1][1] != progress:
                self.samples.append((time.monotonic() - self.started, progress))

    def until(self, condition: Any, what: str) -> None:
        def looked() -> bool:
            self.look()
            return bool(condition())

        wait_for(
            looked,
            timeout_s=120,
            interval_s=0.1,
            what=what,
            detail=lambda: log_tail(self.node.log_path),
        )


def assert_sane_progress(samples: list[tuple[float, dict[str, Any]]], total: int) -> None:
    """Each sample's rate at most what the link carries (with its burst), elapsed seconds
    never going back nor ahead of the real ones, the ETA within the fetch's scale."""
    link_bytes_s = RATE_MBIT * 1e6 / 8
    elapsed = [float(p["elapsedSeconds"]) for _, p in samples]
    assert elapsed == sorted(elapsed), samples
    for real_s, progress in samples:
        assert 0 <= progress["doneBytes"] <= progress["totalBytes"] == total, progress
        assert float(progress["elapsedSeconds"]) <= real_s + 1.0, (real_s, progress)
        rate = progress["bytesPerSecond"]
        assert rate is None or 0 <= rate <= 1.5 * link_bytes_s, progress
        eta = progress["etaSeconds"]
        assert eta is None or 0 <= eta <= 600, progress


@pytest.mark.timeout(240)
def test_a_fetch_through_clock_steps_an_hour_forward_and_back(kit: Kit) -> None:
    bundle = kit.bundle("clock-fetch", [(8 * MIB, 500 + i) for i in range(4)])
    bundle_id = bundle.manifest.bundle_id
    total = sum(blob.size_bytes for blob in bundle.manifest.blobs.values())  # layers and more
    with (
        FakeClock(kit.tmp / "node-1.faketime") as clock,
        started_network(2, rate_mbit=RATE_MBIT) as net,
    ):
        nodes = nodes_of(kit, net, 2, [], "c")
        nodes[1].daemon_env = clock.env()
        with closing_all(*nodes):
            for node in nodes:
                node.start()
            for node in nodes:
                node.wait_listening()
            assert abs(clock.seen_offset_s()) <= 1
            watch = FetchWatch(nodes[1], bundle_id)
            copy_bundle(store_of(nodes[0]), bundle.root, bundle.manifest, kit.keys.trusted_dir)
            for quarter, step_s in ((1, HOUR_S), (2, -HOUR_S), (3, HOUR_S)):
                watch.until(
                    lambda q=quarter: received_bytes(nodes[1]) >= total * q // 4,
                    f"node 1 receiving {quarter}/4 of the bundle",
                )
                assert not fetched(nodes[1], bundle_id), "the fetch ended before the steps"
                clock.step(step_s)
            assert abs(clock.seen_offset_s() - HOUR_S) <= 1
            watch.until(lambda: fetched(nodes[1], bundle_id), "node 1 fetching the bundle")
            real_s = time.monotonic() - watch.started
            log = nodes[1].current_run_log()
            assert_verified_copy(nodes[1], bundle)
            record_file = store_of(nodes[1]) / layout.bundle_dir(bundle_id) / layout.RECORD_NAME
            accepted_s = float(json.loads(record_file.read_text())["acceptedAt"])
    ahead_s = accepted_s - time.time()
    found = re.search(rf"bundle_fetched: bundle={bundle_id} .*?seconds=([0-9.]+)", log)
    assert found is not None, log
    seconds = float(found[1])
    print(
        f"32 MiB at {RATE_MBIT:.0f} Mbit/s through three steps of an hour: fetched in "
        f"{seconds:.1f} s (real {real_s:.1f} s), {len(watch.samples)} progress samples, "
        f"record accepted {ahead_s:+.0f} s from the host's clock"
    )
    assert abs(ahead_s - HOUR_S) <= 120, "the daemon's clock did not step: no drill"
    for word in TROUBLE:
        assert word not in log, f"{word}:\n{log[-3000:]}"
    assert 0 < seconds <= real_s + 1.0
    assert len(watch.samples) >= 3, watch.samples
    assert_sane_progress(watch.samples, total)


def clock_in(message: str) -> datetime:
    """The node's clock as a ``BundleExpired`` message names it."""
    found = re.search(r"this node's clock says (\S+Z)", message)
    assert found is not None, message
    return datetime.strptime(found[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def assert_names_both_times(message: str, expires: str | None, ahead_s: int) -> None:
    """The refusal names the bundle's ``expires`` and the node's clock, ``ahead_s`` ahead."""
    assert f"expired at {expires}" in message, message
    assert abs((clock_in(message) - datetime.now(UTC)).total_seconds() - ahead_s) <= 120, message


def iso_in(seconds: float) -> str:
    """A time ``seconds`` from now as the status file's ``updatedAt`` begins (to compare)."""
    return datetime.fromtimestamp(time.time() + seconds, UTC).isoformat()[:19]


def bundle_set_pinned(status: dict[str, Any], set_name: str) -> bool:
    sets = [s for s in status.get("pinnedImageSets", []) if s["name"] == set_name]
    return bool(sets) and sets[0]["state"] == "Pinned"


def imported(node: SiteNode, bundle: Path, clock: FakeClock) -> tuple[int, dict[str, Any]]:
    """``nodeagent bundle import --json`` on the node, by its (stepped) clock."""
    done = node.cli("bundle", "import", str(bundle), "--json", env=clock.env())
    found = re.search(r"^\{\n.*^\}$", done.stdout, re.MULTILINE | re.DOTALL)
    assert found is not None, (done.returncode, done.stdout, done.stderr)
    return done.returncode, json.loads(found[0])


@dataclass
class ExpirySite:
    """Node 0 holds the bundle (store-only); node 1 (CRI-O) and node 2 (store-only) follow
    it, each daemon on a clock of its own."""

    factory: Factory
    manifest: BundleManifest
    source: SiteNode
    node: SiteNode
    clock: FakeClock
    other: SiteNode
    other_clock: FakeClock

    @property
    def pin_file(self) -> Path:
        assert self.node.crio is not None
        return self.node.crio.dropin_dir / "99-nodeagent-pinned-images.conf"

    def start(self) -> str:
        """Node 0 serving the bundle, node 1 having fetched and pinned it: its pin file."""
        self.source.write_config()
        trusted = self.source.path("etc/nodeagent/trusted-keys.d")
        copy_bundle(store_of(self.source), self.factory.bundle, self.manifest, trusted)
        self.source.start()
        self.node.start()
        self.node.wait_status(lambda s: bundle_pinned(s, self.factory.set_name),
                              what="the bundle fetched and pinned", timeout_s=240)  # fmt: skip
        pins = self.pin_file.read_text()
        assert all(ref.rsplit("@", 1)[-1] in pins for ref in self.factory.refs), pins
        return pins

    def restart_ahead(self) -> dict[str, Any]:
        """Node 1's clock an hour forward, its daemon restarted: the status of its sync."""
        self.clock.step(HOUR_S)
        since = iso_in(HOUR_S - 5)
        self.node.restart()
        self.node.wait_log("sync_finished: seconds=")  # a sync of this run, by the clock ahead
        assert 'status="pinned 1/1 images"' in self.node.current_run_log()
        assert "BundleExpired" not in self.node.current_run_log()
        return self.node.wait_status(
            lambda s: (
                s.get("updatedAt", "") >= since and bundle_set_pinned(s, self.factory.set_name)
            ),
            what="the set still pinned, in a status written an hour ahead",
        )

    def other_refuses_then_fetches(self) -> str:
        """Node 2, its clock an hour ahead, does not fetch the bundle and says why; stepped
        back (and restarted: a bundle skipped is looked at again only after the fetcher's
        ``recheck_s``, 300 s) it fetches it. The journal line of the refusal."""
        bundle_id = self.manifest.bundle_id
        self.other.start()
        refused = f"bundle_not_followed: bundle={bundle_id} reason=Expired"
        self.other.wait_log(refused)
        [line] = [ln for ln in self.other.current_run_log().splitlines() if refused in ln]
        assert_names_both_times(line, self.manifest.expires, HOUR_S)
        assert not (store_of(self.other) / layout.bundle_dir(bundle_id)).exists()
        self.other_clock.step(-HOUR_S)
        self.other.restart()
        self.other.wait_log(f"bundle_fetched: bundle={bundle_id}")
        assert "reason=Expired" not in self.other.current_run_log()
        return line


def expiry_site(
    tmp_path: Path, net: SiteNetwork, factory: Factory, clock: FakeClock, other_clock: FakeClock
) -> ExpirySite:
    ca = make_ca("site CA")
    source_address = f"{net.hosts[0].address}:{SITE_PORT}"
    keys = [factory.public_key]
    trusted = tmp_path / "trusted-keys"
    trusted.mkdir()
    (trusted / "factory.pub").write_text(factory.public_key)
    return ExpirySite(
        factory,
        read_signed(factory.bundle, trusted).manifest,
        SiteNode(tmp_path / "node-0", net.hosts[0], name="node-0", ca=ca, trusted_keys=keys),
        SiteNode(
            tmp_path / "node-1",
            net.hosts[1],
            name="node-1",
            ca=ca,
            peers=[source_address],
            with_crio=True,
            trusted_keys=keys,
            daemon_env=clock.env(),
        ),
        clock,
        SiteNode(
            tmp_path / "node-2",
            net.hosts[2],
            name="node-2",
            ca=ca,
            peers=[source_address],
            trusted_keys=keys,
            daemon_env=other_clock.env(),
        ),
        other_clock,
    )


@pytest.mark.timeout(420)
def test_a_clock_stepped_past_expires_keeps_the_pins_and_refuses_a_new_import(
    tmp_path: Path,
) -> None:
    factory = build_factory(
        tmp_path / "factory", count=1, layer_bytes=1 << 20, seed=37, extra_args=["--expires", "30m"]
    )
    with (
        FakeClock(tmp_path / "node-1.faketime") as clock,
        FakeClock(tmp_path / "node-2.faketime", HOUR_S) as other_clock,
        started_network(3) as net,
    ):
        site = expiry_site(tmp_path, net, factory, clock, other_clock)
        assert site.manifest.expires is not None
        with closing_all(site.source, site.node, site.other):
            pins = site.start()

            # ---- an hour forward, past expires by node 1's clock: the pins stay
            status = site.restart_ahead()
            assert site.pin_file.read_text() == pins

            # ---- the daemon's own import (node 2, an hour ahead): refused, then taken
            skipped = site.other_refuses_then_fetches()

            # ---- a new import by hand on node 1 (its daemon stopped first, as it asks)
            site.node.stop()
            code, report = imported(site.node, factory.bundle, site.clock)
            assert (code, report["state"], report["reason"]) == (65, "rejected", "BundleExpired")
            assert_names_both_times(str(report["message"]), site.manifest.expires, HOUR_S)
            assert site.pin_file.read_text() == pins

            # ---- an hour back: the same bundle is taken again, and stays pinned
            site.clock.step(-HOUR_S)
            code, again = imported(site.node, factory.bundle, site.clock)
            assert code == 0 and again["state"] in ("imported", "pinned"), again
            back, ahead = iso_in(-1), iso_in(HOUR_S - 5)
            site.node.start()
            site.node.wait_status(
                lambda s: (
                    back <= s.get("updatedAt", "") < ahead
                    and bundle_set_pinned(s, factory.set_name)
                ),
                what="the set pinned, in a status written by the clock stepped back",
            )
            assert site.pin_file.read_text() == pins
    print(
        f"expires {site.manifest.expires}; node 1's status an hour ahead: {status['updatedAt']}; "
        f"by hand: {report['message']!r}; node 2: {skipped.strip()!r}"
    )
