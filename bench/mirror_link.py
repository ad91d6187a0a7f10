"""The shaped-link half of ``bench/mirror.py``: a site node's peer server read from another
node's namespace over a ``tbf``-shaped link (``tests/testenv/site_net.py``), and what both
halves need to run the peer process unprivileged on this machine."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from bench.mirror_model import PEER_SERVER, Transfer
from bench.prepull import cpu_s, progress
from tests.testenv.peer_process import VIEW, peer_command
from tests.testenv.site_net import SiteNetwork
from tests.testenv.site_node import SITE_PORT, SiteNode
from tests.testenv.site_pki import issue_node_cert, make_ca, write_ca, write_pem_bundle

if TYPE_CHECKING:
    from bench.mirror import HeldSet


def load1() -> float:
    return os.getloadavg()[0]


def interpreter_view(base: Path) -> list[str]:
    """A prefix (run as root in a private mount namespace) that lets the peer's uid reach the
    interpreter: on this machine it lives under ``/root`` (mode 0700), so a tmpfs of mode
    0711 goes over ``/root`` with only the interpreter's tree bound back into it. Empty when
    the interpreter is reachable already."""
    real = Path(os.path.realpath(sys.executable))
    home = Path("/root")
    if home not in real.parents or home.stat().st_mode & 0o001:
        return []
    top = home / real.relative_to(home).parts[0]
    keep = base / "interpreter-view"
    keep.mkdir(exist_ok=True)
    steps = [
        "set -e",
        f"mount --bind {shlex.quote(str(top))} {shlex.quote(str(keep))}",
        "mount -t tmpfs -o mode=0711,nosuid,nodev nodeagent-bench-root /root",
        f"mkdir {shlex.quote(str(top))}",
        f"mount --bind {shlex.quote(str(keep))} {shlex.quote(str(top))}",
        'exec "$@"',
    ]
    return ["sh", "-c", "; ".join(steps), "sh"]


class LinkNode(SiteNode):
    """A site node whose peer process is started behind ``interpreter_view``."""

    view: Sequence[str] = ()

    def peer_command(self, *args: str) -> list[str]:
        argv = [self.python, "-m", "nodeagent", "--root", f"{VIEW}/root", *args]
        return [*self.exec_prefix, *self.view, *peer_command(self.root, argv)]


def link_blobs(held: HeldSet, limit_bytes: int) -> list[tuple[str, int]]:
    """Layers and configs, largest first, that fit in ``limit_bytes`` (the smallest if none)."""
    chosen: list[tuple[str, int]] = []
    servable = sorted(
        ((d, size) for d, size in held.blobs.items() if d in held.repositories),
        key=lambda kv: (-kv[1], kv[0]),
    )
    for digest, size in servable:
        if sum(s for _, s in chosen) + size <= limit_bytes:
            chosen.append((digest, size))
    return chosen or servable[-1:]


@dataclass(frozen=True)
class LinkClient:
    """``curl`` in node 0's namespace with a node certificate of the site's CA."""

    prefix: tuple[str, ...]
    pem: Path
    ca_file: Path

    def fetch(self, urls: Sequence[str]) -> int:
        """Every URL over one connection, one after another; the bytes received."""
        cmd = [*self.prefix, "curl", "-sS", "--fail", "--max-time", "1800"]
        cmd += ["--cert", str(self.pem), "--key", str(self.pem), "--cacert", str(self.ca_file)]
        for url in urls:
            cmd += ["-o", "/dev/null", "-w", "%{size_download}\\n", url]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"curl over the link: {done.stderr[-2000:]}")
        return sum(int(x) for x in done.stdout.split())


def link_round(
    mode: str, client: LinkClient, urls: Sequence[str], server_pid: int, round_no: int
) -> Transfer:
    expected_mode = PEER_SERVER  # the only path there is yet: see LINK_MODES
    if mode != expected_mode:
        raise ValueError(f"link mode {mode!r} is not measured yet")
    load, before = load1(), cpu_s(server_pid)
    started = time.monotonic()
    got = client.fetch(urls)
    wall = time.monotonic() - started
    return Transfer(mode, round_no, wall, got, 0.0, cpu_s(server_pid) - before, load)


def fetch_over_link(
    base: Path, held: HeldSet, limit_bytes: int, rate_mbit: float, rounds: int
) -> list[Transfer]:
    """The peer server of node 1 (holding the set) read from node 0 over a shaped link."""
    net = SiteNetwork(2, rate_mbit=rate_mbit)
    ca = make_ca("bench mirror site CA")
    transfers = []
    try:
        net.start()
        near, far = net.hosts
        node = LinkNode(base / "link-node", far, name="node-1", ca=ca)
        node.view = interpreter_view(base)
        store = node.state_dir / "store"
        shutil.copytree(held.store, store, copy_function=os.link, dirs_exist_ok=True)  # same files
        pem = write_pem_bundle(base / "client.pem", issue_node_cert(ca, "node-0", [near.address]))
        client = LinkClient(tuple(near.exec_prefix), pem, write_ca(base / "ca.crt", ca))
        blobs = link_blobs(held, limit_bytes)
        urls = [f"https://{far.address}:{SITE_PORT}/v2/{held.repositories[d]}/blobs/{d}"
                for d, _ in blobs]  # fmt: skip
        with node:  # started (until daemon_started), stopped at the end
            node.wait_listening(timeout_s=60)
            assert node.peer is not None
            for round_no in range(1, rounds + 1):
                t = link_round(PEER_SERVER, client, urls, node.peer.pid, round_no)
                if t.bytes_served != sum(size for _, size in blobs):
                    raise RuntimeError(f"{t.bytes_served} bytes over the link, not {blobs}")
                t = replace(t, rate_mbit=rate_mbit)
                transfers.append(t)
                progress(f"  link round {round_no}: {t.mbit_s:.1f} Mbit/s, {t.share:.3f} of "
                         f"{rate_mbit:g}, load {t.load:.2f}")  # fmt: skip
    finally:
        net.stop()
    return transfers
