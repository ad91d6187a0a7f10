"""Attack: someone on the site's network floods the peer port with idle TCP connections.

The attacker needs no certificate: it opens TCP connections to the peer port and sends
nothing (no ClientHello), from one address, then from many (127.0.0.x here). Before
docs/decisions/0052 every one was given asyncio's TLS protocol (a 256 KiB read buffer) and
kept up to 60 s; nothing capped them, so about a thousand exhausted the daemon's file
descriptors (1024 by default) or its memory.

Against the real peer server (``PeerServer`` with real mutual TLS, a real store), in a
process of its own (``tests.testenv.peer_flood_server``) so its resident memory is its own:

* connections above the per-source cap, then above the total cap, are closed at once; the
  server never holds more than its caps;
* an honest node (a client certificate of the site CA) still gets a blob during a flood
  from one address, and once the silent connections of a flood from many are cut;
* a connection that sends no ClientHello is cut at the handshake deadline;
* the server's resident memory under the flood stays within a bound (the figures print).

Loopback only; every loop is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import resource
import selectors
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.store.copier import copy_bundle
from tests.testenv.peer_flood_server import PeerProcess, Settings
from tests.testenv.pki import Authority
from tests.testenv.signed_bundles import Keys, image, signed_bundle
from tests.testenv.waiting import wait_for

KIB = 1 << 10
AT_ONCE_S = 1.0
"""A connection over a cap is closed within this (it is closed when accepted: milliseconds)."""
SLACK_S = 1.5
"""Scheduling slack on a loaded 2-core machine, around the handshake deadline."""


@dataclass(frozen=True)
class Site:
    store: Path
    server_file: Path
    ca_file: Path
    client: ssl.SSLContext
    digest: str
    size: int

    def settings(self, **caps: float) -> Settings:
        return Settings(
            self.store,
            self.server_file,
            self.ca_file,
            max_connections=int(caps["max_connections"]),
            max_per_source=int(caps["max_per_source"]),
            handshake_s=caps["handshake_s"],
            read_buffer_bytes=int(caps["read_buffer_bytes"])
            if "read_buffer_bytes" in caps
            else None,
        )


@pytest.fixture
def site(tmp_path: Path) -> Site:
    pki = tmp_path / "pki"
    pki.mkdir()
    ca = Authority("site CA")
    server_file, ca_file = pki / "kubelet-server-current.pem", pki / "ca.crt"
    ca.serving("node-0").write_pair(server_file, server_file)
    ca_file.write_bytes(ca.cert_pem)
    ca.client("node-1").write_pair(pki / "node-1.crt", pki / "node-1.key")
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    client.load_cert_chain(pki / "node-1.crt", pki / "node-1.key")
    keys = Keys.make(tmp_path / "keys")
    app = image("example/app", [(256 * KIB, 1)], tmp_path / "layers")
    signed = signed_bundle(tmp_path / "stick", keys, [app], bundle_id="site-1", set_name="site")
    copy_bundle(tmp_path / "store", signed.root, signed.manifest, keys.trusted_dir)
    digest, blob = max(signed.manifest.blobs.items(), key=lambda item: item[1].size_bytes)
    return Site(tmp_path / "store", server_file, ca_file, client, digest, blob.size_bytes)


@pytest.fixture(autouse=True)
def _descriptors() -> None:
    """The flood's own sockets: raise this process's soft limit to its hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@contextlib.contextmanager
def serving(site: Site, tmp_path: Path, **caps: float) -> Iterator[PeerProcess]:
    with PeerProcess(site.settings(**caps), tmp_path / "peer.log") as peer:
        yield peer


def fetch_blob(site: Site, port: int, source: str) -> bytes:
    """An honest node's blob download from ``source``: TLS with its certificate, then GET."""
    conn = http.client.HTTPSConnection(
        "127.0.0.1", port, context=site.client, timeout=10, source_address=(source, 0)
    )
    try:
        conn.request("GET", f"/v2/nodeagent/store/blobs/{site.digest}")
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, (response.status, body[:200])
        return body
    finally:
        conn.close()


class Flood:
    """Idle TCP connections to the peer port, each from a given source, sending nothing."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._selector = selectors.DefaultSelector()
        self.opened: dict[socket.socket, float] = {}
        self.closed: dict[socket.socket, float] = {}
        """Socket → seconds from its connect to the server's close."""

    def open(self, source: str, count: int) -> None:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((source, 0))
            sock.settimeout(5)
            sock.connect(("127.0.0.1", self._port))
            sock.setblocking(False)
            self.opened[sock] = time.monotonic()
            self._selector.register(sock, selectors.EVENT_READ)

    def still_open(self) -> list[socket.socket]:
        return [sock for sock in self.opened if sock not in self.closed]

    @property
    def held(self) -> int:
        """Connections the server has not closed (yet)."""
        return len(self.opened) - len(self.closed)

    def watch(self, seconds: float) -> None:
        """Note the connections the server closes within ``seconds``."""
        deadline = time.monotonic() + seconds
        while self.held and (left := deadline - time.monotonic()) > 0:
            for key, _ in self._selector.select(timeout=left):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(1)
                except (ConnectionError, BlockingIOError) as err:
                    if isinstance(err, BlockingIOError):
                        continue
                    data = b""
                assert data == b"", "the server sent something to a silent connection"
                self.closed[sock] = time.monotonic() - self.opened[sock]
                self._selector.unregister(sock)

    def close(self) -> None:
        self._selector.close()
        for sock in self.opened:
            sock.close()


@contextlib.contextmanager
def flooding(port: int) -> Iterator[Flood]:
    flood = Flood(port)
    try:
        yield flood
    finally:
        flood.close()


def test_an_idle_flood_is_held_at_the_caps_and_an_honest_node_still_fetches(
    site: Site, tmp_path: Path
) -> None:
    per_source, total, handshake_s = 4, 16, 3.0
    caps = {"max_connections": total, "max_per_source": per_source, "handshake_s": handshake_s}
    with (
        serving(site, tmp_path, **caps) as peer,
        flooding(peer.port) as one,
        flooding(peer.port) as many,
    ):
        # From one address: three times its cap. The cap is held, the rest closed at once.
        one.open("127.0.0.5", 3 * per_source)
        one.watch(AT_ONCE_S)
        assert one.held == per_source
        assert peer.stats()["open"] == per_source
        # An honest node, another address, during that flood.
        started = time.monotonic()
        body = fetch_blob(site, peer.port, "127.0.0.1")
        fetch_s = time.monotonic() - started
        assert hashlib.sha256(body).hexdigest() == site.digest.removeprefix("sha256:")
        assert one.held == per_source  # still held: the fetch was during the flood
        wait_for(lambda: peer.stats()["open"] == per_source, timeout_s=5, what="the fetch's end")
        # From many addresses: more than the total cap. The total is held; each newcomer
        # over it pushes out the oldest connection still in its handshake (the first flood's
        # first), closed at once.
        for n in range(10, 16):
            many.open(f"127.0.0.{n}", per_source)
        many.watch(AT_ONCE_S)
        one.watch(AT_ONCE_S)
        stats = peer.stats()
        assert stats["open"] == total
        assert (one.held, many.held) == (0, total)
        assert stats["refused"] == {"source-full": 2 * per_source}
        assert stats["pushed_out"] == per_source + 6 * per_source - total
        log = tmp_path / "peer.log"
        assert "peer_refused" not in log.read_text()  # pushed out: counted, not logged
        # A TLS protocol was built for each admitted connection only (the honest one too).
        assert stats["tls_built"] == stats["admitted"] == per_source + 1 + 6 * per_source
        # An honest node, while the total is held by silent connections from 6 addresses.
        started = time.monotonic()
        body = fetch_blob(site, peer.port, "127.0.0.2")
        full_fetch_s = time.monotonic() - started
        assert len(body) == site.size
        many.watch(0.1)
        assert many.held == total - 1  # one pushed out for it; the rest still held
        # The silent connections are cut at the handshake deadline.
        silent = many.still_open()
        many.watch(handshake_s + SLACK_S)
        assert many.held == 0
        drops = [many.closed[sock] for sock in silent]
        assert handshake_s - 0.1 <= min(drops) and max(drops) <= handshake_s + SLACK_S
        # One line per address: the journal is not flooded.
        addresses = {sock.getsockname()[0] for sock in silent}
        wait_for(lambda: log.read_text().count("peer_refused") >= len(addresses), timeout_s=5,
                 what="the refusals logged")  # fmt: skip
        cut = [line for line in log.read_text().splitlines() if "peer_refused" in line]
        assert len(cut) == len(addresses)
        assert all("handshake not finished within 3 s" in line for line in cut)
    print(
        f"\nflood: held {per_source} of {3 * per_source} from one address, {total} of "
        f"{7 * per_source} from 7 (the others closed at once); honest fetch during the "
        f"one-address flood {fetch_s * 1000:.0f} ms, with the total held by silent "
        f"connections {full_fetch_s * 1000:.0f} ms; silent connections cut "
        f"{min(drops):.2f}-{max(drops):.2f} s after connecting (deadline {handshake_s:g} s)"
    )


@dataclass(frozen=True)
class Memory:
    """Resident memory of the server process, in KiB, and its counters at the end."""

    idle: int
    held: int
    """With ``max_connections`` silent connections held."""
    churned: int
    """Then after as many again as the flood tried (each pushing out the oldest)."""
    stats: dict[str, Any]


def rss_under_flood(site: Site, tmp_path: Path, attempts: int, **caps: float) -> Memory:
    """The server's memory idle, with its total held by silent connections (from as many
    sources as the per-source cap needs), and after ``attempts`` of them in all."""
    per_source, cap = int(caps["max_per_source"]), int(caps["max_connections"])
    tmp_path.mkdir(exist_ok=True)
    sources = (f"127.0.{1 + n // 250}.{2 + n % 250}" for n in range(-(-attempts // per_source)))
    with serving(site, tmp_path, **caps) as peer, flooding(peer.port) as flood:
        fetch_blob(site, peer.port, "127.0.0.1")  # warm: a first TLS handshake and send
        idle = peer.rss_kib()
        for _ in range(cap // per_source):
            flood.open(next(sources), per_source)
        wait_for(lambda: peer.stats()["open"] == cap, timeout_s=10, what="the total held")
        held = peer.rss_kib()
        for source in sources:
            flood.open(source, per_source)
        flood.watch(AT_ONCE_S)
        stats = peer.stats()
        churned = peer.rss_kib()
        assert flood.held == stats["open"] == cap
        assert stats["pushed_out"] == attempts - cap
        assert stats["tls_built"] == stats["admitted"] == attempts + 1  # + the warm fetch
    return Memory(idle, held, churned, stats)


BACKLOG = 100
"""Connections asyncio accepts in one go (its listen backlog): each builds its TLS state
before the ones it pushes out are freed (a loop turn later), so a flood's peak is the cap
plus one or two of these."""
EACH_KIB = 100
"""Bound on a silent connection's TLS state: a 16 KiB read buffer and OpenSSL's (asyncio's
default buffer alone is 256 KiB)."""


@pytest.mark.timeout(120)
def test_memory_under_a_flood_at_the_cap_is_bounded(site: Site, tmp_path: Path) -> None:
    caps = {"max_connections": 64, "max_per_source": 8, "handshake_s": 20.0}
    memory = rss_under_flood(site, tmp_path, 256, **caps)
    each = (memory.held - memory.idle) / 64
    print(
        f"\nRSS idle {memory.idle / 1024:.1f} MiB; 64 silent connections held "
        f"{memory.held / 1024:.1f} MiB ({each:.0f} KiB each); after 256 tried "
        f"{memory.churned / 1024:.1f} MiB; fds {memory.stats['fds']}"
    )
    assert each < EACH_KIB
    assert memory.churned - memory.idle < (64 + 2 * BACKLOG) * EACH_KIB


@pytest.mark.security_long
@pytest.mark.timeout(300)
def test_memory_under_a_flood_at_the_default_caps(site: Site, tmp_path: Path) -> None:
    """The default caps (256 in total, 8 per source) under 1,024 silent connections from 128
    addresses, and what asyncio's 256 KiB read buffer would have cost at the same cap."""
    caps = {"max_connections": 256, "max_per_source": 8, "handshake_s": 60.0}
    ours = rss_under_flood(site, tmp_path / "ours", 1024, **caps)
    default = {**caps, "read_buffer_bytes": 256 * KIB}
    theirs = rss_under_flood(site, tmp_path / "asyncio", 1024, **default)
    each, each_256 = ((m.held - m.idle) / 256 for m in (ours, theirs))
    print(
        f"\nRSS idle {ours.idle / 1024:.1f} MiB; 256 held {ours.held / 1024:.1f} MiB "
        f"(+{(ours.held - ours.idle) / 1024:.1f} MiB, {each:.0f} KiB each); after 1,024 "
        f"tried from 128 addresses {ours.churned / 1024:.1f} MiB "
        f"(+{(ours.churned - ours.idle) / 1024:.1f} MiB); fds {ours.stats['fds']}. With "
        f"asyncio's 256 KiB buffer: +{(theirs.held - theirs.idle) / 1024:.1f} MiB held "
        f"({each_256:.0f} KiB each), +{(theirs.churned - theirs.idle) / 1024:.1f} MiB after"
    )
    assert ours.churned - ours.idle < (256 + 2 * BACKLOG) * EACH_KIB
    assert each < each_256 / 2
    assert ours.stats["fds"] < 256 + 64
