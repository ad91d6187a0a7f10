"""The fetcher task's wiring: which peers a node asks (never itself), and when it runs."""

from __future__ import annotations

from pathlib import Path

from nodeagent.config import load_config
from nodeagent.daemon.fetching import other_peers, own_addresses
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
