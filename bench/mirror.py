"""Node mirror benchmark (issue 25): CRI-O pulling from it against docker-registry, a peer
server over a shaped link, and the peer process's idle memory.

A set of S bytes (default 2 GB: 8 images of one layer of seeded random data each, gzip -1;
layers cached in ``~/.cache/nodeagent-testenv/blobs``) is built in process, signed as a
bundle (``tests/testenv/signed_bundles.py``) and copied into a node store
(``adapters.store.copier.copy_bundle``, the stick path's copier), laid out as the package
leaves it (``tests/testenv/peer_process.prepare_node``). The same images are pushed to
Debian's ``docker-registry`` (``tests/testenv/registry.py``) whose storage is on the same
file system. Then:

1. **Pulls** (``--rounds``, default 2; docker-registry last in odd rounds, first in even
   ones). Each round starts a node mirror process and pulls the set from it twice:
   ``node-mirror``, its first requests (every blob hashed as it is sent), and
   ``node-mirror-again`` (the blobs verified in this process go out by ``sendfile`` alone).
   For each pull a fresh CRI-O (empty vfs store) whose registries.conf.d holds
   the drop-in nodeagent renders (``MirrorDropin``: each repository mirrored at the source,
   digest-only), written before CRI-O starts, so the images' own registry
   (``registry.example:5000``, which does not exist) is never asked. The page cache is dropped
   (``sync; echo 3 > drop_caches``) and CRI-O pulls every image by digest through CRI, one
   after another. The node mirror is the real ``nodeagent serve-mirror`` (``[mirror]
   listen`` on a free loopback port, bound by itself: no socket passed) run as its unit runs it:
   unprivileged, no capability, the store bound read-only (``tests/testenv/peer_process.py``,
   in a private mount namespace of its own), on the bundled modules only (the interpreter of
   ``tests/integration/pins/test_idle_memory.py``, ``MALLOC_ARENA_MAX=2``). Before its first
   request its idle VmRSS is taken (steady for 2 s), after the pulls its peak (VmHWM).
   Goal: node mirror <= 1.05 x docker-registry, the median of the per-round ratios (both
   pulls are shown; the first is checked first).

2. **The shaped link** (``--link-mb`` of the set's blobs, default 256 MB). A site network of
   two node namespaces with ``tbf`` at ``--rate-mbit`` (100) each way
   (``tests/testenv/site_net.py``); node 1 is a store-only site node
   (``tests/testenv/site_node.py``: the daemon and its ``serve-peers`` peer process, mutual
   TLS) holding the set; from node 0's namespace one ``curl`` (a node certificate of the
   site's CA) fetches blob after blob over one connection from node 1's peer server
   (``/v2/<repository>/blobs/<digest>``, the route the site fetcher uses). Goal: >= 0.9 x
   the link's rate. This is the peer server's path (the same ``Listener`` and content code
   as the node mirror), not yet a node mirror that fetches from a peer (issue 25 item 4):
   ``bench.mirror_model.LINK_MODES`` is where that mode goes once it exists.

Run as root (loop-free, but CRI-O, namespaces and drop_caches need it)::

    .venv/bin/python -m bench.mirror [--size-gb 2] [--rounds 2] [--link-mb 256]
        [--rate-mbit 100] [--skip-link] [--skip-pulls] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench.bundle_import import drop_caches, machine_cpu_s, machine_spent
from bench.fanout_model import layer_sizes
from bench.mirror_link import fetch_over_link, interpreter_view, load1
from bench.mirror_model import (
    GB,
    MB,
    MIB,
    NODE_MIRROR,
    NODE_MIRROR_AGAIN,
    REGISTRY,
    Figures,
    Pull,
    render,
)
from bench.prepull import cpu_s, progress, status_kib
from nodeagent.adapters.bundles.mirror import MirrorDropin
from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.bundles.mirror import mirror_repositories
from nodeagent.config.mirror import NODE_MIRROR_DROPIN_NAME
from nodeagent.references import parse_pinned_image_ref
from tests.integration.pins.test_idle_memory import runtime_python, steady_rss_kib
from tests.testenv.crio import Crio
from tests.testenv.images import BuiltImage, LayerSpec, TestImage, push
from tests.testenv.peer_process import STORE_DIR, VIEW, peer_command, prepare_node
from tests.testenv.registry import Registry, free_port
from tests.testenv.signed_bundles import Keys, signed_bundle
from tests.testenv.site_net import SiteNetUnavailable
from tests.testenv.waiting import log_tail, wait_for

REPO = Path(__file__).resolve().parents[1]
PULL_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class HeldSet:
    images: tuple[BuiltImage, ...]
    refs: tuple[str, ...]
    """``registry.example:5000/<repo>@<digest>`` of each image (a registry that does not exist)."""
    blobs: dict[str, int]
    repositories: dict[str, str]
    """A repository holding each blob (for the peer's ``/v2/<repo>/blobs/<digest>``)."""
    node_root: Path
    """A node's root whose ``var/lib/nodeagent/store`` holds the set."""

    @property
    def store(self) -> Path:
        return self.node_root / STORE_DIR


def build_set(base: Path, size_bytes: int, layers: int, seed: int) -> HeldSet:
    """``layers`` images of one layer each, signed as a bundle, copied into a node store."""
    sizes = layer_sizes(size_bytes, layers)
    progress(f"generating (or reusing) {layers} layers of {sizes[0] / MB:.1f} MB")
    images = tuple(
        TestImage(f"bench/mirror-{i}", [LayerSpec(size, seed + i)]).build()
        for i, size in enumerate(sizes)
    )
    keys = Keys.make(base / "keys")
    signed = signed_bundle(base / "bundle", keys, images, bundle_id="bench-mirror", set_name="m")
    node_root = base / "node"
    prepare_node(node_root)
    progress("copying the set into the node store")
    copy_bundle(node_root / STORE_DIR, signed.root, signed.manifest, keys.trusted_dir)
    shutil.rmtree(signed.root)
    repositories = {b.digest: img.repository for img in images for b in img.blobs()}
    return HeldSet(
        images,
        tuple(str(i.ref) for i in signed.manifest.images),
        {d: f.size_bytes for d, f in signed.manifest.blobs.items()},
        repositories,
        node_root,
    )


# ------------------------------------------------------------------ the node mirror


@contextmanager
def node_mirror_process(root: Path, port: int, python: str) -> Iterator[subprocess.Popen[bytes]]:
    """``nodeagent serve-mirror`` serving the node mirror on 127.0.0.1:``port``, as
    ``nodeagent-mirror.service`` runs it (unprivileged, the store read-only; here it binds
    the port itself, where the unit gets it from its socket)."""
    config = root / "etc/nodeagent/config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f'[site]\nserve = false\n\n[mirror]\nlisten = "127.0.0.1:{port}"\n')
    argv = [python, "-m", "nodeagent", "--root", f"{VIEW}/root", "serve-mirror"]
    cmd = ["unshare", "--mount", "--propagation", "private", *interpreter_view(root.parent)]
    cmd += peer_command(root, argv)
    env = dict(os.environ, MALLOC_ARENA_MAX="2")
    env.pop("PYTHONPATH", None)  # the runtime interpreter sets its own
    log_path = root / "serve-mirror.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, cwd="/", umask=0o077)

    def listening() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"serve-mirror exited {process.returncode}:\n{log_tail(log_path)}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening, timeout_s=60, interval_s=0.1, what="the node mirror to listen")
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ------------------------------------------------------------------ pulls


async def _pull_each(endpoint: str, refs: Sequence[str]) -> None:
    async with CriClient(endpoint) as cri:
        for ref in refs:
            await cri.pull_image(ref, timeout_s=PULL_TIMEOUT_S)
            if await cri.image_status(ref) is None:
                raise RuntimeError(f"CRI-O says it pulled {ref} but does not hold it")


def pull_set(
    base: Path, held: HeldSet, source: str, *, host: str, server_pid: int, round_no: int
) -> Pull:
    """A fresh CRI-O pulls every image of the set with ``host`` as every repository's mirror."""
    crio = Crio(base / f"crio-{source}-{round_no}")
    crio.write_files()
    dropin = MirrorDropin(crio.registries_dir / NODE_MIRROR_DROPIN_NAME, crio.registries_conf)
    if not dropin.write(mirror_repositories(parse_pinned_image_ref(r) for r in held.refs), host):
        raise RuntimeError("the mirror drop-in was not written")
    with crio:
        assert crio.process is not None
        drop_caches()
        load = load1()
        crio_before, server_before = cpu_s(crio.process.pid), cpu_s(server_pid)
        machine_before = machine_cpu_s()
        started = time.monotonic()
        asyncio.run(_pull_each(crio.endpoint, held.refs))
        wall = time.monotonic() - started
        pull = Pull(
            source=source,
            round_no=round_no,
            wall_s=wall,
            bytes_pulled=sum(held.blobs.values()),
            crio_cpu_s=cpu_s(crio.process.pid) - crio_before,
            server_cpu_s=cpu_s(server_pid) - server_before,
            machine_cpu_s=machine_spent(machine_before)["machine"],
            load=load,
        )
    progress(f"  {source} round {round_no}: {wall:.2f} s ({pull.mb_s:.0f} MB/s), load {load:.2f}")
    return pull


def mirror_round(
    base: Path, held: HeldSet, python: str, round_no: int
) -> tuple[list[Pull], float, float]:
    """A node mirror process started for this round: its idle VmRSS, the pull of the set as
    its first requests (every blob hashed as sent), the same pull again (blobs verified in
    this process go out by ``sendfile`` alone), its peak VmRSS."""
    port = free_port()
    with node_mirror_process(held.node_root, port, python) as mirror:
        idle = steady_rss_kib(mirror.pid, timeout_s=60.0) / 1024
        progress(f"peer process serving the node mirror, idle: {idle:.2f} MiB")
        host = f"127.0.0.1:{port}"
        pulls = [
            pull_set(base, held, source, host=host, server_pid=mirror.pid, round_no=round_no)
            for source in (NODE_MIRROR, NODE_MIRROR_AGAIN)
        ]
        return pulls, idle, status_kib(mirror.pid, "VmHWM") / 1024


def measure_pulls(base: Path, held: HeldSet, rounds: int, fig: Figures) -> Figures:
    python = runtime_python(base)
    base.chmod(0o755)  # the peer's uid reads the runtime interpreter's site under it
    pulls: list[Pull] = []
    idle, busy = [], []
    with Registry(base / "registry") as registry:
        progress(f"pushing the set to docker-registry at {registry.host}")
        for image in held.images:
            push(registry.url, image.repository, image)
        assert registry.pid is not None
        for round_no in range(1, rounds + 1):
            registry_first = round_no % 2 == 0
            if registry_first:
                pulls.append(pull_set(base, held, REGISTRY, host=registry.host,
                                      server_pid=registry.pid, round_no=round_no))  # fmt: skip
            mirrored, rss, peak = mirror_round(base, held, python, round_no)
            pulls += mirrored
            idle.append(rss)
            busy.append(peak)
            if not registry_first:
                pulls.append(pull_set(base, held, REGISTRY, host=registry.host,
                                      server_pid=registry.pid, round_no=round_no))  # fmt: skip
    return replace(
        fig,
        pulls=tuple(pulls),
        peer_idle_rss_mib=statistics.median(idle),
        peer_busy_rss_mib=max(busy),
    )


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.mirror", description=__doc__.split("\n")[0])
    p.add_argument("--size-gb", type=float, default=2.0, help="the set's size S, GB (default 2)")
    p.add_argument("--images", type=int, default=8, help="images, one layer each (default 8)")
    p.add_argument("--rounds", type=int, default=2, help="pull rounds, sources alternating (2)")
    p.add_argument("--link-mb", type=float, default=256.0, help="MB over the link a round (256)")
    p.add_argument("--link-rounds", type=int, default=2, help="rounds over the link (2)")
    p.add_argument("--rate-mbit", type=float, default=100.0, help="the link's rate each way (100)")
    p.add_argument("--seed", type=int, default=25_000, help="layer content seed (25000)")
    p.add_argument("--skip-pulls", action="store_true", help="only the link")
    p.add_argument("--skip-link", action="store_true", help="only the pulls")
    p.add_argument("--workdir", type=Path, help="parent of the temp dir (default: $TMPDIR)")
    p.add_argument("--json", action="store_true", help="JSON on stdout (the table on stderr)")
    opts = p.parse_args(argv)
    if opts.images < 1 or opts.rounds < 1 or opts.size_gb <= 0:
        p.error("--images and --rounds need at least 1, --size-gb more than 0")
    return opts


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run_all(base: Path, opts: argparse.Namespace) -> Figures:
    held = build_set(base, int(opts.size_gb * GB), opts.images, opts.seed)
    fig = Figures(sum(held.blobs.values()), len(held.images), len(held.blobs))
    if not opts.skip_pulls:
        fig = measure_pulls(base, held, opts.rounds, fig)
    if not opts.skip_link:
        try:
            limit = int(opts.link_mb * MB)
            transfers = fetch_over_link(base, held, limit, opts.rate_mbit, opts.link_rounds)
            fig = replace(fig, transfers=tuple(transfers))
        except SiteNetUnavailable as exc:
            fig.notes.append(f"the link was not measured: {exc}")
    return fig


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if os.geteuid() != 0:
        print(
            "bench.mirror runs CRI-O, namespaces and drop_caches: run it as root", file=sys.stderr
        )
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _raise_exit)
    base = Path(tempfile.mkdtemp(prefix="nodeagent-bench-mirror-", dir=opts.workdir))
    started_load = load1()
    try:
        fig = run_all(base, opts)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    header = [
        f"machine: {os.cpu_count()} CPUs, load {started_load:.2f} at start, {load1():.2f} at end;"
        f" MiB = {MIB} B, MB = {MB} B",
    ]
    text = render(fig, header)
    if opts.json:
        print(json.dumps(asdict(fig), indent=2))
        print(text, file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
