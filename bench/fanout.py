"""Site fan-out benchmark: one stick in node 0, until every node holds the verified bundle.

A signed bundle of S bytes (default 1 GB in 32 layers of random data, 8 images x 4 layers,
48 blobs with configs and manifests; the largest at most S/16), generated in process
(``tests/testenv/signed_bundles.py``; layers cached in ``~/.cache/nodeagent-testenv/blobs``)
and put on an ext4 stick (``mkfs.ext4 -d``, label ``NODEAGENT1``). For each N (default 2, 4,
8), a site network of N node namespaces with links of R each way (``SiteNetwork(n,
rate_mbit=R)``, tbf on both ends of each veth), a CA, and one nodeagent per node
(``tests/testenv/site_node.py``) with ``[site] serve = true``, ``follow = "on"`` and static
``peers``. Node 0 has its own CRI-O (the stick path imports and pins) and the test udevd
runs in its namespace, so the stick (a loop device attached after the daemons are idle,
page cache dropped first) is node 0's alone; the other nodes are store-only. Two runs
per N, fresh state each:

* ``fanout``: every node's peers are all the others (re-serving as they fetch);
* ``from-node-0`` (the baseline): every node's only peer is node 0. With N = 2 the two
  configurations are the same, so the fan-out run stands for both.

Measured from the stick's attach (time 0), polling each node's store every 0.25 s with the
same scan its holdings publisher runs (``adapters.store.holdings``): a node's first byte (a
partial or a blob of the bundle), and when its store holds the bundle complete; ``stick``
is node 0's, T_all the last node's. At the end each node's peer server is asked for its
holdings over mutual TLS (``curl`` inside its namespace, parsed by
``site.holdings.parse_holdings``): every node must say complete, with one manifest digest.
Then the daemons stop and every store is re-hashed (``adapters.store.keeper.verify``): a
blob failing its digest, a partial file left, or an integrity reason code in a daemon's log
is counted. The store poll also gives when each node held half and 90 % of the bytes (the
tail of its fetch). Also: the loop device's sectors read (the medium read once), each daemon's CPU
(``/proc/<pid>/stat``, from attach to the end), CRI-O's, the machine's, each node's bytes
sent and received on its link, idle RSS of the store-only daemons before the stick
(serving and following on) next to the 40 MiB budget, and a model of T_all for 100 and 1000
nodes calibrated from the runs (``bench/fanout_model.py`` says the model and its
assumptions). Run as root::

    .venv/bin/python -m bench.fanout [--size-gb 1] [--blobs 32] [--nodes 2,4,8]
        [--rate-mbit 100] [--max-uploads 4] [--fetch-concurrency 4] [--json] [--quick]

Goals (issue 15): T_all(N=8) <= 1.5 x S/R + stick copy time, and <= 0.3 x the
all-from-node-0 time; the medium read once; zero unverified bytes stored or served.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.bundle_import import drop_caches, machine_cpu_s, machine_spent, sectors_read
from bench.fanout_model import (
    FANOUT,
    GB,
    MB,
    NODE0,
    NodeResult,
    Run,
    Workload,
    layer_sizes,
    render_report,
    runs_from_json,
    shape_problems,
    summarize,
)
from bench.fanout_probe import (
    BUNDLE_ID,
    Watch,
    check_end,
    idle_rss_mib,
    integrity_events,
    link_bytes,
    peer_drops,
    wait_all,
)
from bench.prepull import cpu_s, progress, status_kib
from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.keeper import verify
from nodeagent.bundles.manifest import BundleManifest
from nodeagent.config.settings import SiteSettings
from tests.testenv.bundles import ext4_media
from tests.testenv.host_view import own_containers_dir
from tests.testenv.images import LayerSpec, TestImage
from tests.testenv.node_udevd import NodeUdevd
from tests.testenv.packages import ensure_packages
from tests.testenv.signed_bundles import Keys, signed_bundle
from tests.testenv.site_net import SiteHost, SiteNetUnavailable, SiteNetwork
from tests.testenv.site_node import SiteNode, stick_udevd
from tests.testenv.site_pki import Issued, make_ca
from tests.testenv.udev import LoopMedia

SET_NAME = "bench-fanout"
LAYERS_PER_IMAGE = 4


@dataclass(frozen=True)
class Bundle:
    root: Path
    public_key: str
    manifest: BundleManifest

    @property
    def blobs(self) -> dict[str, int]:
        return {d: f.size_bytes for d, f in self.manifest.blobs.items()}


def make_bundle(
    base: Path, size_bytes: int, layers: int, seed: int, cache_dir: Path | None = None
) -> Bundle:
    """``layers`` layers of seeded random data, 4 an image, signed in process under ``base``
    (generated layers cached in ``cache_dir``, default the test environment's cache)."""
    sizes = layer_sizes(size_bytes, layers)
    progress(f"generating (or reusing) {len(sizes)} layers of {sizes[0] / MB:.1f} MB")
    images = []
    for first in range(0, len(sizes), LAYERS_PER_IMAGE):
        chunk = range(first, min(first + LAYERS_PER_IMAGE, len(sizes)))
        specs = [LayerSpec(sizes[i], seed + i) for i in chunk]
        name = f"bench/fanout-{first // LAYERS_PER_IMAGE}"
        images.append(TestImage(name, specs).build(cache_dir))
    keys = Keys.make(base / "keys")
    signed = signed_bundle(base / "bundle", keys, images, bundle_id=BUNDLE_ID, set_name=SET_NAME)
    public = next((base / "keys").glob("*.pub")).read_text()
    return Bundle(signed.root, public, signed.manifest)


# ------------------------------------------------------------------ one run


class Probe(Protocol):
    """More to observe in a run (``bench/scale_fanout.py``): told when the stick is
    attached, at each poll of the stores, and at the end while the nodes still run."""

    def started(self, nodes: list[SiteNode], since: float) -> None: ...

    def poll(self) -> None: ...

    def ended(self, nodes: list[SiteNode]) -> None: ...


@dataclass(frozen=True)
class Setup:
    """What every run of one site size shares."""

    net: SiteNetwork
    stick: LoopMedia
    bundle: Bundle
    ca: Issued
    timeout_s: float
    work: Workload


def make_nodes(base: Path, mode: str, setup: Setup) -> list[SiteNode]:
    net, ca, bundle, work = setup.net, setup.ca, setup.bundle, setup.work
    addresses = [f"{h.address}:9447" for h in net.hosts]
    nodes = []
    for host in net.hosts:
        i = host.index
        if mode == FANOUT:
            peers = [a for j, a in enumerate(addresses) if j != i]
        else:
            peers = [] if i == 0 else [addresses[0]]
        nodes.append(
            SiteNode(
                base / f"node-{i}",
                host,
                name=f"node-{i}",
                ca=ca,
                peers=peers,
                serve=True,
                with_crio=i == 0,
                has_stick=i == 0,
                watch_media=i == 0,
                trusted_keys=[bundle.public_key],
                extra_config=(
                    f'follow = "on"\nmax_uploads = {work.max_uploads}\n'
                    f"fetch_concurrency = {work.fetch_concurrency}\n"
                ),
            )
        )
    return nodes


def measure(base: Path, mode: str, setup: Setup, probe: Probe | None = None) -> Run:
    """One run on fresh nodes under ``base`` (removed at the end); ``probe``: more to watch."""
    net, stick, bundle, timeout_s = setup.net, setup.stick, setup.bundle, setup.timeout_s
    bundle_id = bundle.manifest.bundle_id
    nodes = make_nodes(base, mode, setup)
    watches = [Watch(n, bundle.blobs, bundle_id=bundle_id) for n in nodes]
    on_poll = None if probe is None else probe.poll
    with ExitStack() as stack:
        udevd = stack.enter_context(stick_listener(base, net.hosts[0]))
        stack.callback(stick.detach)
        for node in nodes:
            stack.callback(node.close)
        for node in nodes:
            node.start(ready="daemon_started", timeout_s=120)
        for node in nodes:
            node.wait_listening(timeout_s=60)
        nodes[0].wait_log("media_watch_started", timeout_s=60)
        rss = idle_rss_mib(nodes[1:])
        links = [link_bytes(n) for n in nodes]
        drop_caches()
        pids = [n.process.pid for n in nodes if n.process is not None]
        crio = nodes[0].crio
        assert crio is not None and crio.process is not None
        cpu_before = [cpu_s(p) for p in pids]
        crio_before, machine_before = cpu_s(crio.process.pid), machine_cpu_s()
        since = time.monotonic()
        if probe is not None:
            probe.started(nodes, since)
        devnode = stick.attach()
        read_before = sectors_read(devnode)
        progress(f"  {mode} N={len(nodes)}: stick attached ({devnode})")
        wait_all(watches[:1], since, timeout_s, on_poll, also=watches[1:])
        udevd.stop()  # node 0 holds the bundle: the stick has done its part
        wait_all(watches, since, timeout_s, on_poll)
        t_all = max(w.complete_s or 0.0 for w in watches)
        progress(f"  T_all {t_all:.1f} s (node 0: {watches[0].complete_s:.1f} s)")
        cpu = [cpu_s(p) - b for p, b in zip(pids, cpu_before, strict=True)]
        crio_cpu, spent = cpu_s(crio.process.pid) - crio_before, machine_spent(machine_before)
        read = (sectors_read(devnode) - read_before) * 512
        after = [link_bytes(n) for n in nodes]
        peaks = [status_kib(p, "VmHWM") / 1024 for p in pids]
        check_end(nodes, bundle_id)
        if probe is not None:
            probe.ended(nodes)
    verified = [verify(w.store) for w in watches]
    partials = sum(len(BlobStore(w.store).partials()) for w in watches)
    per_node = tuple(
        NodeResult(
            index=i,
            first_byte_s=w.first_byte_s,
            complete_s=w.complete_s,
            bytes_held=w.bytes_held,
            cpu_s=cpu[i],
            sent_bytes=after[i][0] - links[i][0],
            received_bytes=after[i][1] - links[i][1],
            peak_rss_mib=peaks[i],
            half_s=w.half_s,
            ninety_s=w.ninety_s,
        )
        for i, w in enumerate(watches)
    )
    run = Run(
        mode=mode,
        nodes=len(nodes),
        stick_s=watches[0].complete_s or 0.0,
        t_all_s=t_all,
        medium_read_bytes=read,
        per_node=per_node,
        crio_cpu_s=crio_cpu,
        machine_cpu_s=spent["machine"],
        steal_s=spent["steal"],
        corrupt_blobs=sum(len(v.corrupt) for v in verified),
        partial_files=partials,
        integrity_events=sum(integrity_events(n) for n in nodes),
        peer_drops=sum(peer_drops(n) for n in nodes),
        idle_rss_mib=rss,
    )
    shutil.rmtree(base, ignore_errors=True)  # N stores of S each
    return run


@contextmanager
def site(n: int, rate_mbit: float) -> Iterator[SiteNetwork]:
    """The site's network, torn down after its runs."""
    net = SiteNetwork(n, rate_mbit=rate_mbit)
    try:
        net.start()
        yield net
    finally:
        net.stop()


@contextmanager
def stick_listener(base: Path, host: SiteHost) -> Iterator[NodeUdevd]:
    """Node 0's udevd (``tests/testenv/node_udevd.py``), started before the daemons: node 0
    alone hears the stick, beside any udevd of the host's."""
    udevd = stick_udevd(base / "udevd", host)
    udevd.start()
    try:
        yield udevd
    finally:
        udevd.stop()


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.fanout", description=__doc__.split("\n")[0])
    p.add_argument("--size-gb", type=float, default=1.0, help="bundle size S, GB (default 1)")
    p.add_argument("--blobs", type=int, default=32, help="layers, 4 an image (default 32)")
    p.add_argument("--nodes", default="2,4,8", help="site sizes N, comma-separated (2,4,8)")
    p.add_argument("--rate-mbit", type=float, default=100.0, help="link rate R each way (100)")
    p.add_argument("--modes", default=f"{FANOUT},{NODE0}", help="runs per N (both)")
    p.add_argument(
        "--max-uploads",
        type=int,
        default=SiteSettings().max_uploads,
        help="[site] max_uploads of every node (default: the setting's default)",
    )
    p.add_argument(
        "--fetch-concurrency",
        type=int,
        default=SiteSettings().fetch_concurrency,
        help="[site] fetch_concurrency of every node (default: the setting's)",
    )
    p.add_argument("--seed", type=int, default=15_000, help="layer content seed (15000)")
    p.add_argument("--timeout-s", type=float, default=0.0, help="per run (default: from S/R)")
    p.add_argument("--workdir", type=Path, help="parent of the temp dir (default: $TMPDIR)")
    p.add_argument("--quick", action="store_true", help="smoke test: 64 MB, N = 2,3")
    p.add_argument("--json", action="store_true", help="JSON on stdout (the table on stderr)")
    p.add_argument("--from-json", type=Path, help="print the table of a saved --json run")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.size_gb, opts.nodes = 0.064, "2,3"
    opts.node_counts = sorted({int(x) for x in opts.nodes.split(",")})
    opts.mode_list = [m for m in opts.modes.split(",") if m]
    if min(opts.node_counts) < 2 or set(opts.mode_list) - {FANOUT, NODE0}:
        p.error(f"--nodes needs N >= 2; --modes is {FANOUT} and/or {NODE0}")
    return opts


def run_all(base: Path, opts: argparse.Namespace) -> tuple[list[Run], Workload, Bundle]:
    bundle = make_bundle(base, int(opts.size_gb * GB), opts.blobs, opts.seed)
    sizes = sorted(bundle.blobs.values())
    for problem in shape_problems(sizes):
        progress(f"note: the bundle is not of the issue's shape: {problem}")
    work = Workload(
        sum(sizes), len(sizes), sizes[-1], opts.rate_mbit, opts.max_uploads, opts.fetch_concurrency
    )
    ca = make_ca("bench fan-out site CA")
    runs: list[Run] = []
    with ext4_media(base, bundle.root) as stick:
        shutil.rmtree(bundle.root)
        for n in opts.node_counts:
            modes = [
                m
                for m in opts.mode_list
                if not (m == NODE0 and n == 2 and FANOUT in opts.mode_list)
            ]
            with site(n, opts.rate_mbit) as net:
                for mode in modes:
                    worst = (n - 1) * work.ideal_transfer_s * 3 + 300
                    setup = Setup(net, stick, bundle, ca, opts.timeout_s or worst, work)
                    runs.append(measure(base / f"{mode}-{n}", mode, setup))
    return runs, work, bundle


def header(work: Workload) -> list[str]:
    return [
        f"workload: bundle {work.size_bytes / GB:.3f} GB in {work.blob_count} blobs (largest "
        f"{work.largest_blob_bytes / MB:.1f} MB), links {work.rate_mbit:g} Mbit/s each way "
        f"(S/R {work.ideal_transfer_s:.1f} s), max_uploads {work.max_uploads}, "
        f"fetch_concurrency {work.fetch_concurrency}",
        f"machine: {os.cpu_count()} CPUs, Linux {platform.release()}, Python "
        f"{platform.python_version()}; node 0 with CRI-O and the stick, the others store-only",
    ]


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.from_json is not None:
        runs, work = runs_from_json(json.loads(opts.from_json.read_text()))
        print(render_report(runs, work, header(work)))
        return 0
    if os.geteuid() != 0:
        print(
            "bench.fanout makes network namespaces and loop devices: run it as root",
            file=sys.stderr,
        )
        return 2
    ensure_packages({"curl": "/usr/bin/curl"})
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _raise_exit)
    base = Path(tempfile.mkdtemp(prefix="nodeagent-bench-fanout-", dir=opts.workdir))
    try:
        with own_containers_dir():
            runs, work, _bundle = run_all(base, opts)
    except SiteNetUnavailable as exc:
        print(f"bench.fanout: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if opts.json:
        summary = summarize(runs, work)
        doc: dict[str, Any] = {
            "workload": asdict(work),
            "runs": [asdict(r) for r in runs],
            "checks": summary["checks"],
            "calibration": asdict(summary["calibration"]),
            "model": summary["model"],
            "growth": summary["growth"],
        }
        print(json.dumps(doc, indent=2))
        print(render_report(runs, work, header(work)), file=sys.stderr)
    else:
        print(render_report(runs, work, header(work)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
