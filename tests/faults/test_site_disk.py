"""Drill (issue 30 item 5): a node's disk fills up while it serves its peers.

Three node namespaces on a bridge, links of ``RATE_MBIT`` each way, each node with its own
CRI-O, daemon and unprivileged peer process (``tests/testenv/site_stick.py``), no registry.
Node 0's ``/var/lib`` (its state directory and store, and the kubelet's files) is a small
ext4 of its own (``make_disk``). Node 0 imports the bundle from the stick and pins it; the
stick is pulled. Nodes 1 and 2 start and fetch the bundle from node 0. Once both fetches run,
another writer takes every free block of node 0's disk, and a new set (the bundle's images
under another name) lands on node 0, so its daemon must write its ledger and status while
the disk is full.

Proves:

* serving from the full disk goes on: nodes 1 and 2 finish their fetch (from node 0 or each
  other) and pin, and every peer they dropped on the way is named with a reason;
* node 0's daemon and peer process keep running, its pins stay (the drop-in CRI-O reads and
  CRI's ``pinned``), and its journal names the cause (``HostFileError``: "No space left on
  device", with the file it could not write), as does systemd's ``STATUS=`` line; the status
  file cannot (it is on the full disk: it keeps its last content);
* node 0 leaves nothing half-written: no temporary file of an atomic write, every JSON file
  of its state directory and store parses, ``nodeagent store verify`` finds every blob whole;
* once the writer's file is removed, node 0 comes back by itself (no restart): a later sync
  pins the new set and writes the status again, nothing degraded.

71-78 s here (node 0 is back 34-39 s after the space: the daemon retries a sync that failed
for a permanent cause after a minute, ``sync.loop.SyncSchedule.retry_max_s``), so it is
``drill_long``; ``make test`` runs the fast check below.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.files import write_atomic
from nodeagent.errors import HostFileError
from nodeagent.logs import event_of
from nodeagent.ports import StoredImage
from tests.faults.conftest import DiskFactory
from tests.faults.consistency import half_written_in, hold
from tests.faults.node import DROPIN, NotifyListener, pins_of
from tests.faults.test_disk import MIB, fill
from tests.faults.test_site import now, three_nodes
from tests.testenv.agent import pinned_image_set_yaml, set_state
from tests.testenv.bundles import Factory, build_factory, ext4_media
from tests.testenv.site_node import STATE_DIR, SiteNode
from tests.testenv.site_pki import make_ca
from tests.testenv.site_stick import bundle_pinned, fanout_nodes
from tests.testenv.waiting import log_tail, wait_for

pytestmark = pytest.mark.drill

RATE_MBIT = 8.0
"""Each node's link: the bundle (about 10 MiB) takes node 1 and 2 over 10 s from node 0."""
NO_SPACE = "No space left on device"
REFUSED_WRITES = frozenset({"sync_failed", "status_not_saved"})
"""What node 0's journal says while the disk is full (``sync.reconciler.Reconciler.run``,
``reporting.Reporter.save``), with ``reason=HostFileError`` and the kernel's words."""
PEER_PROBLEMS = frozenset({"bundle_fetch_peer_dropped", "bundle_fetch_failed", "peer_demoted"})


def fill_to_the_brim(mountpoint: Path) -> list[Path]:
    """Another writer takes every free block: ``fill`` leaves 1 MiB (one allocation of all of
    it may not fit its own extent tree), then a second file grows until the filesystem
    refuses (ENOSPC). Returns both, for the technician to remove."""
    files = [fill(mountpoint, leave_bytes=MIB), mountpoint / "filler-brim"]
    chunk = b"\0" * 1024  # the smallest ext4 block: none is left free
    with files[1].open("wb", buffering=0) as out:
        try:
            while out.write(chunk):
                pass
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
    return files


def test_a_write_to_a_full_disk_is_refused_whole_and_named(make_disk: DiskFactory) -> None:
    """The fast check ``make test`` runs: the atomic write every state file goes through
    (``adapters.files.write_atomic``) fails on a full filesystem naming the cause, keeps the
    file it would have replaced and leaves no temporary file; once space is back it writes."""
    disk = make_disk(16)
    state = disk / "state"
    status = state / "status.json"
    write_atomic(status, b'{"before": true}')
    fillers = fill_to_the_brim(disk)
    with pytest.raises(HostFileError, match=NO_SPACE):
        write_atomic(status, b'{"after": true}' + b" " * 8192)
    assert status.read_bytes() == b'{"before": true}'
    assert half_written_in([state], state) == []
    for filler in fillers:
        filler.unlink()
    assert write_atomic(status, b'{"after": true}')
    assert status.read_bytes() == b'{"after": true}'


def pins_of_node(node: SiteNode) -> set[str]:
    """The pins CRI-O reads: its drop-in, through nodeagent's link."""
    assert node.crio is not None
    return set(pins_of((node.crio.dropin_dir / DROPIN).read_text()))


async def stored(node: SiteNode) -> list[StoredImage]:
    assert node.crio is not None
    async with CriClient(node.crio.endpoint, timeout_s=30) as cri:
        return await cri.list_images()


def pinned_by_cri(images: list[StoredImage], refs: list[str]) -> list[str]:
    """Those of ``refs`` CRI lists as stored and pinned."""
    return [r for r in refs if any(r in i.names() and i.is_pinned for i in images)]


def both_pinned(status: dict[str, Any], set_name: str, since: str) -> bool:
    """A status written ``since`` with the bundle's set and ``also`` pinned, nothing
    degraded."""
    degraded = [c for c in status.get("conditions", []) if c["type"] == "Degraded"]
    return (
        status.get("updatedAt", "") >= since
        and set_state(status, set_name) == set_state(status, "also") == "Pinned"
        and bool(degraded)
        and degraded[0]["status"] == "False"
    )


def start_together(nodes: list[SiteNode]) -> None:
    """Their CRI-Os first, then the daemons one right after the other: the fetches overlap."""
    for node in nodes:
        assert node.crio is not None
        node.crio.start()
    for node in nodes:
        node.start(ready=None)
    for node in nodes:
        node.wait_log("daemon_started")


def lines_of(node: SiteNode, events: frozenset[str]) -> list[str]:
    """This run's journal lines of ``events``."""
    return [s for s in node.current_run_log().splitlines() if event_of(s) in events]


def refused_writes(node: SiteNode) -> list[str]:
    """The writes the full disk refused, as the journal names them."""
    found = lines_of(node, REFUSED_WRITES)
    return [s for s in found if "reason=HostFileError" in s and NO_SPACE in s]


@pytest.mark.drill_long
@pytest.mark.timeout(600)
async def test_a_node_whose_disk_fills_while_it_serves_keeps_serving_and_pinning(
    tmp_path: Path, make_disk: DiskFactory
) -> None:
    factory = build_factory(tmp_path / "factory", count=2, layer_bytes=4 << 20, seed=3051)
    ca = make_ca("site CA")
    disk = make_disk(64, at=tmp_path / "node-0" / "var" / "lib")
    with three_nodes(tmp_path, rate_mbit=RATE_MBIT) as net:
        nodes = fanout_nodes(tmp_path, net, ca, factory.public_key)
        notify = NotifyListener(tmp_path / "notify-0.sock")  # what ``systemctl status`` shows
        nodes[0].extra_env["NOTIFY_SOCKET"] = str(notify.path)
        try:
            await serve_through_a_full_disk(tmp_path, nodes, disk, factory, notify)
        finally:
            for node in nodes:
                node.close()
            notify.close()


async def serve_through_a_full_disk(
    tmp_path: Path, nodes: list[SiteNode], disk: Path, factory: Factory, notify: NotifyListener
) -> None:
    """The drill, once the nodes are laid out (closed by the caller)."""
    server, fetchers = nodes[0], nodes[1:]
    with ext4_media(tmp_path, factory.bundle) as media:
        server.start(ready="media_watch_started")
        media.attach()
        server.wait_status(
            lambda s: bundle_pinned(s, factory.set_name), what="pinned", timeout_s=240
        )
    # the stick is out; node 0 serves its store from here on
    start_together(fetchers)
    for node in fetchers:
        node.wait_log("bundle_fetch_started", timeout_s=120)

    # ---- another writer fills node 0's disk while both fetch from it
    fillers = fill_to_the_brim(disk)
    unfinished = [n.name for n in fetchers if "bundle_fetched:" not in n.current_run_log()]
    assert unfinished == [n.name for n in fetchers], "a fetch ended before the disk filled"
    specs = server.path("/etc/nodeagent/pinnedimagesets.d")
    (specs / "also.yaml").write_text(pinned_image_set_yaml("also", factory.refs))
    wait_for(
        lambda: refused_writes(server),
        timeout_s=60,
        what="node 0's journal naming the full disk",
        detail=lambda: log_tail(server.log_path),
    )
    # the status file is on the full disk and keeps its last content; systemd's STATUS= says it
    wait_for(
        lambda: (lines := notify.statuses()) and "(HostFileError)" in lines[-1],
        timeout_s=10,
        what="node 0's STATUS= naming HostFileError",
        detail=lambda: str(notify.statuses()[-3:]),
    )
    print("STATUS=", notify.statuses()[-1])

    for node in fetchers:  # serving goes on: both finish, from node 0 or each other
        node.wait_status(lambda s: bundle_pinned(s, factory.set_name), what="pinned", timeout_s=240)
        print(node.name, [line for line in node.current_run_log().splitlines()
                          if line.startswith("bundle_fetched:")])  # fmt: skip
        for problem in lines_of(node, PEER_PROBLEMS):  # each says why
            assert re.search(r" reason=[A-Z]\w+", problem), problem
    free = os.statvfs(disk)
    assert free.f_bavail * free.f_frsize < 1 << 20, "the disk did not stay full"

    # ---- node 0 while its disk is full: running, pins kept, nothing half-written
    def still_pinning() -> bool:
        assert server.process is not None and server.peer is not None
        assert server.process.poll() is None, log_tail(server.log_path)
        assert server.peer.poll() is None, log_tail(server.log_path)
        return set(factory.refs) <= pins_of_node(server)

    hold(still_pinning, for_s=3, what="node 0's pins")
    assert pinned_by_cri(await stored(server), factory.refs) == factory.refs
    state_dir = server.path(f"/{STATE_DIR}")
    assert server.crio is not None
    dirs = [state_dir, server.crio.dropin_dir, server.path("/run/nodeagent")]
    assert half_written_in(dirs, state_dir) == []

    # ---- space back: node 0 recovers by itself, no restart
    for filler in fillers:
        filler.unlink()
    freed_at, freed_s = now(), time.monotonic()
    server.wait_status(
        lambda s: both_pinned(s, factory.set_name, freed_at),
        what="both sets pinned in a status written after the space came back",
        timeout_s=150,
    )
    print(f"node 0 back to normal {time.monotonic() - freed_s:.1f} s after the space came back")
    assert server.runs == 1, "node 0 was restarted"
    assert set(factory.refs) <= pins_of_node(server)
    assert half_written_in(dirs, state_dir) == []
    verified = await asyncio.to_thread(server.cli, "store", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "all match their digests" in verified.stdout, verified.stdout
