"""The fetcher task's wiring: which peers a node asks (never itself), and when it runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nodeagent.config import load_config
from nodeagent.daemon.fetching import MIN_LOOK_GAP_S, _next_look, other_peers, own_addresses
from nodeagent.daemon.root import tasks
from nodeagent.site.discovery import PeerView, StaticPeers


def config_with(tmp_path: Path, site: str) -> Path:
    path = tmp_path / "etc/nodeagent/config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(f"[site]\n{site}\n")
    return path


def test_a_static_list_shared_by_every_node_never_makes_a_node_its_own_peer(
    tmp_path: Path,
) -> None:
    config_with(
        tmp_path,
        'listen = "10.0.0.2:9447"\npeers = ["10.0.0.1:9447", "10.0.0.2:9447", "10.0.0.3:9447"]',
    )
    config = load_config(Path("/etc/nodeagent/config.toml"), root=tmp_path)
    own = own_addresses(config)
    assert own == {"10.0.0.2:9447"}
    found = other_peers(StaticPeers(config.site.peers).peers(), own)
    assert [p.address for p in found] == ["10.0.0.1:9447", "10.0.0.3:9447"]
    advertised = [PeerView("10.0.0.9:9447"), PeerView("10.0.0.1:9447")]
    assert other_peers(advertised, {"10.0.0.9:9447"}) == [PeerView("10.0.0.1:9447")]


def test_the_fetcher_task_runs_only_when_the_node_follows(tmp_path: Path) -> None:
    from nodeagent.daemon.wiring import build

    for site, expected in (
        ('follow = "auto"', False),  # no cluster mode, no peers
        ('follow = "auto"\npeers = ["10.0.0.1:9447"]', True),
        ('follow = "off"\npeers = ["10.0.0.1:9447"]', False),
        ('follow = "on"', True),
    ):
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        config_with(root, site)
        config = load_config(Path("/etc/nodeagent/config.toml"), root=root)
        names = [t.name for t in tasks(build(config), watcher=None)]  # type: ignore[arg-type]
        assert ("site-fetcher" in names) is expected, site


class Directory:
    """A peer directory whose version changes when told (``StaticPeers`` never does)."""

    def __init__(self) -> None:
        self.version = 0
        self._changed = asyncio.Event()

    def change(self) -> None:
        self.version += 1
        self._changed.set()

    def peers(self) -> list[PeerView]:
        return []

    async def changed(self, since: int) -> int:
        while self.version == since:
            await self._changed.wait()
        return self.version


async def timed(directory: Directory, wanted: asyncio.Event, wait_s: float) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await _next_look(directory, directory.version, wanted, wait_s)  # type: ignore[arg-type]
    return loop.time() - started


async def test_a_digest_the_node_mirror_lacked_wakes_the_fetcher_before_its_poll() -> None:
    wanted = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, wanted.set)
    seconds = await timed(Directory(), wanted, wait_s=30.0)
    assert MIN_LOOK_GAP_S <= seconds < 5.0  # not the poll's 30 s; not sooner than the gap
    assert not wanted.is_set()  # taken: the next wait waits again


async def test_misses_cost_one_look_a_gap_at_most_and_the_poll_still_ends_a_wait() -> None:
    wanted = asyncio.Event()
    wanted.set()  # a flood of misses already waiting
    first = await timed(Directory(), wanted, wait_s=30.0)
    assert first >= MIN_LOOK_GAP_S
    second = await timed(Directory(), wanted, wait_s=0.2)  # nothing asked since: the poll
    assert 0.15 <= second < 1.0


async def test_a_changed_directory_still_wakes_the_fetcher_at_once() -> None:
    directory = Directory()
    asyncio.get_running_loop().call_later(0.05, directory.change)
    assert await timed(directory, asyncio.Event(), wait_s=30.0) < MIN_LOOK_GAP_S
