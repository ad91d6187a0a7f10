"""Attack: a crafted stick that makes the node's kernel parse a filesystem of the attacker's
choosing (issue 24 finding 4; docs/operations.md "Which media are taken", decision 0054).

The attacker plugs in a medium labelled ``NODEAGENT*``: a filesystem whose kernel driver
nodeagent does not need (btrfs here: a large parser, with a history of crafted-image bugs),
or an allowed filesystem on a device that is not a USB port (a loop device stands for an
internal or virtual disk). nodeagent must decide from udev's properties alone, BEFORE any
mount: nothing is mounted (the daemon's own ``/proc/<pid>/mountinfo`` and its media
directory say so), the refusal is logged once per plug-in with its reason however many
udev events the device sends, and the status names it. The allowed kind (ext4 on a bus the
configuration allows) still imports.

Real parts: systemd-udevd, loop devices, the daemon (``nodeagent run``), CRI-O. The daemon
of the tests takes loop devices because its configuration says so
(``tests.testenv.udev.TEST_MEDIA_CONFIG``); the first test puts the default back with a
drop-in, as a site would change it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.testenv.agent import Agent
from tests.testenv.bundles import ext4_media
from tests.testenv.crio import Crio
from tests.testenv.images import default_cache_dir
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle
from tests.testenv.udev import LoopMedia, Udevd, settle

MIB = 1 << 20
REFUSED = "bundle_media_refused"


@pytest.fixture(scope="module")
def udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        yield daemon


@pytest.fixture
def attached() -> Iterator[list[LoopMedia]]:
    media: list[LoopMedia] = []
    yield media
    for medium in media:
        if medium.devnode is not None:
            subprocess.run(["umount", "--lazy", medium.devnode], check=False)
            medium.detach()
        medium.image.unlink(missing_ok=True)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys.make(tmp_path / "keys")


@pytest.fixture
def bundle(tmp_path: Path, keys: Keys) -> Signed:
    images = [image("crafted-stick/good", [(MIB, 1900), (MIB, 1901)], default_cache_dir())]
    return signed_bundle(
        tmp_path / "bundle", keys, images, bundle_id="stick-good", set_name="stick-good",
        sequence=1,
    )  # fmt: skip


@pytest.fixture
def agent(tmp_path: Path, fresh_crio: Crio, keys: Keys) -> Agent:
    agent = Agent(tmp_path / "agent", fresh_crio, watch_media=True)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(
        (keys.trusted_dir / "factory.pub").read_text()
    )
    return agent


def report_of(status: dict[str, Any], source: str | None) -> dict[str, Any]:
    found = [b for b in status.get("bundles", []) if b["source"] == source]
    return dict(found[-1]) if found else {}


def in_state(source: str, state: str) -> Callable[[dict[str, Any]], bool]:
    return lambda status: report_of(status, source).get("state") == state


def refusals(agent: Agent, devnode: str) -> list[str]:
    return [
        line
        for line in agent.current_run_log().splitlines()
        if REFUSED in line and f"device={devnode} " in f"{line} "
    ]


def mounted_anything(agent: Agent, devnode: str) -> list[str]:
    """The daemon's mounts of ``devnode`` or under its media directory (its own namespace)."""
    assert agent.process is not None
    lines = Path(f"/proc/{agent.process.pid}/mountinfo").read_text().splitlines()
    media = str(agent.media_dir)
    return [
        line
        for line in lines
        if line.split()[4].startswith(media) or line.split(" - ")[1].split()[1] == devnode
    ]


def crafted(tmp_path: Path, bundle: Signed, fs_type: str, label: str) -> LoopMedia:
    files = {
        str(path.relative_to(bundle.root)): (path.read_bytes(), 0o644)
        for path in bundle.root.rglob("*")
        if path.is_file()
    }
    return LoopMedia.create(tmp_path / f"media-{label}", fs_type, label=label, files=files)


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("udevd")
def test_by_default_a_stick_on_a_bus_that_is_not_usb_is_refused_and_never_mounted(
    agent: Agent, bundle: Signed, tmp_path: Path, attached: list[LoopMedia]
) -> None:
    dropin = agent.config_file.parent / "config.d" / "50-site.toml"
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text('[bundles]\nmedia_buses = ["usb"]\n')  # the default, over the tests'
    stick = ext4_media(tmp_path, bundle.root)  # the right filesystem and label
    (tmp_path / "marker").mkdir()
    marker = ext4_media(tmp_path / "marker", bundle.root, label="NODEAGENT-MARK")
    attached += [stick, marker]
    with agent:
        agent.wait_log("media_watch_started")
        devnode = stick.attach()
        status = agent.wait_status(in_state(devnode, "rejected"), what="the stick refused")
        assert report_of(status, devnode)["reason"] == "BundleMediaRefused"
        assert "on the loop bus" in report_of(status, devnode)["message"]
        stick.trigger_add()  # udev tells again: no second line
        settle()
        marked = marker.attach()  # events reach the daemon in order: the stick's came first
        agent.wait_status(in_state(marked, "rejected"), what="the marker refused")
        assert mounted_anything(agent, devnode) == []
        [line] = refusals(agent, devnode)
        assert "bus=loop" in line and "media_buses: usb" in line, line
    assert not agent.media_dir.exists() or list(agent.media_dir.iterdir()) == []


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("udevd")
def test_a_crafted_btrfs_stick_is_refused_once_never_mounted_and_ext4_still_imports(
    agent: Agent, bundle: Signed, tmp_path: Path, attached: list[LoopMedia]
) -> None:
    evil = crafted(tmp_path, bundle, "btrfs", "NODEAGENT-EVIL")
    marker = crafted(tmp_path, bundle, "btrfs", "NODEAGENT-MARK")
    good = ext4_media(tmp_path, bundle.root)
    attached += [evil, marker, good]
    with agent:
        agent.wait_log("media_watch_started")
        devnode = evil.attach()
        status = agent.wait_status(in_state(devnode, "rejected"), what="the btrfs stick refused")
        report = report_of(status, devnode)
        assert report["reason"] == "BundleMediaRefused", report
        assert "filesystem btrfs is not one nodeagent mounts" in report["message"]
        for _ in range(3):
            evil.trigger_add()  # the same medium, told again and again
        settle()
        marked = marker.attach()  # events reach the daemon in order: evil's came first
        agent.wait_status(in_state(marked, "rejected"), what="the marker refused")
        assert mounted_anything(agent, devnode) == []
        [line] = refusals(agent, devnode)
        assert "fs=btrfs" in line and "media_fs_types: ext4, vfat" in line, line

        source = good.attach()
        agent.wait_status(in_state(source, "pinned"), what="the ext4 stick imported and pinned")
        assert mounted_anything(agent, devnode) == []
        assert agent.process is not None and agent.process.poll() is None
