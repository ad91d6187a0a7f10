"""``[site]``: peer addresses and the peer server's settings are checked when loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.config import Config, load_config
from nodeagent.config.addresses import Address, parse_address
from nodeagent.errors import ConfigInvalid


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("10.0.0.11:9447", Address("10.0.0.11", 9447)),
        ("[fd00::1]:9447", Address("fd00::1", 9447)),
        ("node-1.site.example:1", Address("node-1.site.example", 1)),
        ("192.0.2.1:65535", Address("192.0.2.1", 65535)),
    ],
)
def test_addresses_parse(text: str, address: Address) -> None:
    assert parse_address(text) == address
    assert str(address) == text


@pytest.mark.parametrize(
    "text",
    [
        "10.0.0.11",
        "10.0.0.11:0",
        "10.0.0.11:65536",
        "10.0.0.256:9447",
        "fd00::1:9447",
        "[fd00::zz]:9447",
        "[fd00::1]9447",
        "node_1:9447",
        ":9447",
        "host:+80",
        "host:٣",
        "a" * 400 + ":1",
        "host\n:1",
    ],
)
def test_non_addresses_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_address(text)


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(path)


def test_site_settings_load(tmp_path: Path) -> None:
    config = load_config(tmp_path / "missing.toml")
    assert not config.site.serve and config.site.peers == ()
    text = (
        '[site]\nserve = true\npeers = ["10.0.0.12:9447", "[fd00::2]:9447"]\n'
        'upload_max_bytes = "40MiB"\nfollow = "on"\n'
    )
    root = tmp_path / "root"
    (root / "etc/nodeagent").mkdir(parents=True)
    (root / "etc/nodeagent/config.toml").write_text(text)
    loaded = load_config(Path("/etc/nodeagent/config.toml"), root=root)
    assert loaded.site.peers == ("10.0.0.12:9447", "[fd00::2]:9447")  # never re-rooted
    assert loaded.site.upload_max_bytes == 40 << 20
    assert loaded.site.ca_file == root / "etc/kubernetes/kubelet-ca.crt"


def test_connection_caps_and_networks_load(tmp_path: Path) -> None:
    text = '[site]\nallow_from = ["10.0.0.0/24", "fd00:1::/64"]\nmax_connections_per_source = 4\n'
    loaded = _load(tmp_path, text)
    assert isinstance(loaded, Config)
    assert loaded.site.allow_from == ("10.0.0.0/24", "fd00:1::/64")
    assert (loaded.site.max_connections, loaded.site.max_connections_per_source) == (256, 4)
    assert loaded.site.handshake_timeout_s == 5.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('peers = ["10.0.0.12"]', "site.peers in"),
        ('peers = ["a:1", "a:1"]', "distinct addresses"),
        ("peers = [1]", "a string"),
        ('listen = "everywhere"', "site.listen"),
        ('follow = "yes"', "one of on, off, auto"),
        ("max_uploads = 0", "from 1 to 256"),
        ("request_timeout_s = 0", "greater than 0"),
        ("peers = [" + ", ".join(['"a:1"'] * 257) + "]", "at most 256"),
        ("handshake_timeout_s = 0", "greater than 0 and at most 60"),
        ("handshake_timeout_s = 61", "greater than 0 and at most 60"),
        ("max_connections = 1025", "from 1 to 1024"),
        ("max_connections = 4\nmax_connections_per_source = 5", "at most site.max_connections"),
        ('allow_from = ["10.0.0.1/24"]', "a list of networks"),
        ('allow_from = ["everywhere"]', "a list of networks"),
    ],
)
def test_site_settings_are_checked(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigInvalid, match=message.replace("(", r"\(")):
        _load(tmp_path, f"[site]\n{text}\n")
