"""A signed bundle on a loop device reaches the daemon through udev and is imported and pinned.

Real parts: systemd-udevd with loop devices, CRI-O, the daemon. The registry the bundle was
made from is stopped before the medium is plugged in: no registry is reachable.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.bundles import minisign
from tests.testenv import blkio
from tests.testenv.agent import Agent, set_state
from tests.testenv.bundles import Factory, build_factory, ext4_media
from tests.testenv.crio import Crio
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import cluster_config, install_deploy
from tests.testenv.udev import LoopMedia, Udevd, free_loop_device, settle
from tests.testenv.waiting import wait_for


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Factory:
    return build_factory(tmp_path_factory.mktemp("factory"), count=4, layer_bytes=3 << 20, seed=99)


@pytest.fixture(scope="module")
def targeted(tmp_path_factory: pytest.TempPathFactory) -> Factory:
    """A bundle only for nodes labelled site=line-3 (format 2, its target signed)."""
    return build_factory(
        tmp_path_factory.mktemp("targeted"), count=2, layer_bytes=1 << 20, seed=77,
        extra_args=["--target-selector", "site=line-3"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        yield daemon


@pytest.fixture
def media_cleanup(tmp_path: Path) -> Iterator[list[LoopMedia]]:
    attached: list[LoopMedia] = []
    yield attached
    for media in attached:
        if media.devnode is not None:
            subprocess.run(["umount", "--lazy", media.devnode], check=False)
            media.detach()


def agent_for(tmp_path: Path, crio: Crio, public_key: str, **kwargs: Any) -> Agent:
    agent = Agent(tmp_path / "agent", crio, watch_media=True, **kwargs)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(public_key)
    return agent


def bundle_state(status: dict[str, Any]) -> str | None:
    bundles = status.get("bundles", [])
    return str(bundles[-1]["state"]) if bundles else None


def last_bundle(status: dict[str, Any]) -> dict[str, Any]:
    return dict(status["bundles"][-1])


async def stored(crio: Crio, refs: list[str]) -> list[str]:
    async with CriClient(crio.endpoint) as cri:
        return [ref for ref in refs if await cri.image_status(ref) is not None]


async def pinned(crio: Crio, refs: list[str]) -> list[str]:
    async with CriClient(crio.endpoint) as cri:
        found = [await cri.image_status(ref) for ref in refs]
    return [ref for ref, image in zip(refs, found, strict=True) if image and image.is_pinned]


def mounted_below(path: Path) -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4] for line in lines if line.split()[4].startswith(str(path))]


async def test_good_bundle_is_imported_and_pinned_with_no_registry_and_only_once(
    udevd: Udevd,
    factory: Factory,
    fresh_crio: Crio,
    tmp_path: Path,
    media_cleanup: list[LoopMedia],
) -> None:
    media = ext4_media(tmp_path, factory.bundle)
    media_cleanup.append(media)
    agent = agent_for(tmp_path, fresh_crio, factory.public_key)
    with agent:
        agent.wait_log("daemon_started")
        media.attach()
        status = agent.wait_status(
            lambda s: bundle_state(s) == "pinned" and set_state(s, factory.set_name) == "Pinned",
            what="bundle imported and its set pinned",
        )
        assert await pinned(fresh_crio, factory.refs) == factory.refs
        report = last_bundle(status)
        assert report["bundleId"] == "line-3-test"
        assert report["images"] == {"total": 4, "present": 4}
        assert "factory" in report["signedBy"]
        assert not (fresh_crio.registries_dir / "99-nodeagent-bundle-mirror.conf").exists()
        assert mounted_below(agent.media_dir) == []
        log = agent.current_run_log()
        for event in (
            "bundle_media_detected",
            "bundle_verified",
            "bundle_admitted",
            "bundle_importing",
            "bundle_imported",
            "set_pinned",
        ):
            assert event in log, event

        # The same stick again: recognized, nothing pulled a second time.
        pulled_before = log.count("image_pulled")
        subprocess.run(["udevadm", "trigger", "--action=remove", str(media.devnode)], check=True)
        settle()
        media.trigger_add()
        agent.wait_log("bundle_already_imported")
        assert agent.current_run_log().count("image_pulled") == pulled_before


async def test_bundle_signed_by_unknown_key_is_rejected_before_any_import(
    udevd: Udevd,
    factory: Factory,
    fresh_crio: Crio,
    tmp_path: Path,
    media_cleanup: list[LoopMedia],
) -> None:
    media = ext4_media(tmp_path, factory.bundle)
    media_cleanup.append(media)
    other_public, _ = minisign.generate_keypair(comment="someone else")
    agent = agent_for(tmp_path, fresh_crio, other_public)
    with agent:
        agent.wait_log("daemon_started")
        media.attach()
        status = agent.wait_status(lambda s: bundle_state(s) == "rejected", what="rejection")
    assert last_bundle(status)["reason"] == "BundleSignedByUnknownKey"
    assert await stored(fresh_crio, factory.refs) == []
    assert list(agent.persistent_dir.glob("bundle-*")) == []
    assert "bundle_importing" not in agent.log_text()


async def test_tampered_blob_is_rejected_and_no_set_is_applied(
    udevd: Udevd,
    factory: Factory,
    fresh_crio: Crio,
    tmp_path: Path,
    media_cleanup: list[LoopMedia],
) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(factory.bundle, damaged)
    blobs = sorted((damaged / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)
    largest = blobs[-1]
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    largest.write_bytes(bytes(data))
    media = ext4_media(tmp_path, damaged)
    media_cleanup.append(media)
    agent = agent_for(tmp_path, fresh_crio, factory.public_key)
    with agent:
        agent.wait_log("daemon_started")
        media.attach()
        status = agent.wait_status(
            lambda s: bundle_state(s) == "rejected", what="rejection", timeout_s=180
        )
    assert last_bundle(status)["reason"] == "BundleDigestMismatch"
    assert list(agent.persistent_dir.glob("bundle-*")) == []
    assert set_state(status, factory.set_name) is None
    assert len(await stored(fresh_crio, factory.refs)) < len(factory.refs)
    assert not (fresh_crio.registries_dir / "99-nodeagent-bundle-mirror.conf").exists()


@pytest.fixture(scope="module")
def big_factory(tmp_path_factory: pytest.TempPathFactory) -> Factory:
    workdir = tmp_path_factory.mktemp("big-factory")
    return build_factory(workdir, count=8, layer_bytes=16 << 20, seed=1234)


@pytest.mark.needs("blkio")
async def test_medium_removed_mid_import_leaves_node_consistent_and_resumes(
    udevd: Udevd,
    big_factory: Factory,
    fresh_crio: Crio,
    tmp_path: Path,
    media_cleanup: list[LoopMedia],
) -> None:
    """Removed while the bundle is copied into the node's store (the medium read at 16 MB/s):
    interrupted, nothing in the runtime yet; plugged in again, the import resumes and ends
    pinned. (Removed after the status said it may be, the import goes on: tests/faults.)"""
    media = ext4_media(tmp_path, big_factory.bundle)
    media_cleanup.append(media)
    agent = agent_for(tmp_path, fresh_crio, big_factory.public_key, pull_settings="concurrency = 1")
    devnode = free_loop_device()
    with agent:
        agent.wait_log("daemon_started")
        assert agent.process is not None
        with blkio.throttled_reads(agent.process.pid, devnode, 16 * 1000 * 1000):
            media.attach(devnode)
            agent.wait_status(lambda s: bundle_state(s) == "storing", what="storing")
            subprocess.run(["udevadm", "trigger", "--action=remove", devnode], check=True)
            status = agent.wait_status(lambda s: bundle_state(s) == "interrupted", what="interrupt")
        assert last_bundle(status)["reason"] == "BundleMediaRemoved"
        assert "mediumRemovable" not in last_bundle(status)
        assert not (fresh_crio.registries_dir / "99-nodeagent-bundle-mirror.conf").exists()
        assert list(agent.persistent_dir.glob("bundle-*")) == []
        assert await stored(fresh_crio, big_factory.refs) == []

        media.trigger_add()
        agent.wait_status(
            lambda s: (
                bundle_state(s) == "pinned" and set_state(s, big_factory.set_name) == "Pinned"
            ),
            what="import resumed and pinned",
        )
    assert await pinned(fresh_crio, big_factory.refs) == big_factory.refs
    for ref in big_factory.refs:
        assert agent.current_run_log().count(f"image_pulled: image={ref}") == 1


async def test_not_enough_space_is_refused_before_anything_is_copied(
    udevd: Udevd,
    factory: Factory,
    small_store: Path,
    tmp_path: Path,
    media_cleanup: list[LoopMedia],
) -> None:
    media = ext4_media(tmp_path, factory.bundle)
    media_cleanup.append(media)
    with Crio(tmp_path / "crio", storage_root=small_store) as crio:
        agent = agent_for(tmp_path, crio, factory.public_key, extra_config="")
        with agent:
            agent.wait_log("daemon_started")
            media.attach()
            status = agent.wait_status(lambda s: bundle_state(s) == "rejected", what="refusal")
        assert await stored(crio, factory.refs) == []
    report = last_bundle(status)
    assert report["reason"] == "InsufficientDiskSpace"
    assert "not enough disk space" in report["message"]
    assert report["bytes"]["served"] == 0
    assert "bundle_importing" not in agent.log_text()


async def test_a_stick_for_other_nodes_is_refused_and_imported_by_hand_with_ignore_target(
    udevd: Udevd,
    targeted: Factory,
    fresh_crio: Crio,
    tmp_path: Path,
    media_cleanup: list[LoopMedia],
) -> None:
    """A standalone node has no labels, so a bundle with a target selector is not for it:
    the plugged stick is refused, nothing imported; the technician who knows better imports
    the same bundle with ``bundle import --ignore-target``."""
    media = ext4_media(tmp_path, targeted.bundle)
    media_cleanup.append(media)
    agent = agent_for(tmp_path, fresh_crio, targeted.public_key)
    with agent:
        agent.wait_log("daemon_started")
        media.attach()
        status = agent.wait_status(lambda s: bundle_state(s) == "rejected", what="rejection")
        report = last_bundle(status)
        assert (report["reason"], report["bundleId"]) == ("BundleNotInTarget", "line-3-test")
        assert "'site=line-3'" in report["message"]
        assert "--ignore-target" in report["message"]
        assert "bundle_importing" not in agent.log_text()
        wait_for(lambda: mounted_below(agent.media_dir) == [], timeout_s=30, what="stick unmounted")
    assert await stored(fresh_crio, targeted.refs) == []
    assert list(agent.persistent_dir.glob("bundle-*")) == []

    refused = agent.cli("bundle", "import", str(targeted.bundle), "--json")
    assert refused.returncode == 65, refused.stderr
    assert '"reason": "BundleNotInTarget"' in refused.stdout
    done = agent.cli("bundle", "import", str(targeted.bundle), "--ignore-target", "--json")
    assert done.returncode == 0, done.stderr
    assert "bundle_target_ignored" in done.stderr + done.stdout
    assert "amd64 nodes matching 'site=line-3'" in done.stderr + done.stdout  # bundle_verified
    assert await stored(fresh_crio, targeted.refs) == targeted.refs
    assert await pinned(fresh_crio, targeted.refs) == targeted.refs


@pytest.mark.usefixtures("udevd")
async def test_in_cluster_mode_a_stick_is_imported_when_the_nodes_labels_match_its_target(
    targeted: Factory,
    fresh_crio: Crio,
    kube: KubeCluster,
    tmp_path: Path,
    media_cleanup: list[LoopMedia],
) -> None:
    """The daemon judges a stick's target by the labels its Node informer gave it (the real
    kube-apiserver): a Node labelled site=line-3 takes the bundle made for site=line-3."""
    install_deploy(kube)
    node = "target-line-3"
    kube.create_node(node, labels={"site": "line-3", "node-role.kubernetes.io/worker": ""})
    media = ext4_media(tmp_path, targeted.bundle)
    media_cleanup.append(media)
    agent = agent_for(
        tmp_path, fresh_crio, targeted.public_key, extra_config=cluster_config(kube, node)
    )
    with agent:
        agent.wait_log("cluster_sets_changed")  # the Node, the sets and the pools listed
        media.attach()
        status = agent.wait_status(
            lambda s: (
                bundle_state(s) == "rejected"
                or (bundle_state(s) == "pinned" and set_state(s, targeted.set_name) == "Pinned")
            ),
            what="the targeted bundle imported and its set pinned (or refused)",
        )
        assert last_bundle(status).get("reason") is None, last_bundle(status)
        assert "amd64 nodes matching 'site=line-3'" in agent.current_run_log()
    assert await pinned(fresh_crio, targeted.refs) == targeted.refs
    kube.kubectl_ok("delete", "node", node)


@pytest.mark.usefixtures("udevd")
async def test_in_cluster_mode_a_stick_plugged_in_before_the_node_is_known_waits_for_its_labels(
    targeted: Factory,
    fresh_crio: Crio,
    kube: KubeCluster,
    tmp_path: Path,
    media_cleanup: list[LoopMedia],
) -> None:
    """Unknown is not "no": a targeted stick found at start, before the Node is registered
    (a first boot: the kubelet registers it later), waits for the Node's labels (up to
    ``[cluster] request_timeout_s``), then is judged by them and imported."""
    install_deploy(kube)
    node = "target-late-node"
    media = ext4_media(tmp_path, targeted.bundle)
    media_cleanup.append(media)
    media.attach()
    agent = agent_for(
        tmp_path, fresh_crio, targeted.public_key, extra_config=cluster_config(kube, node)
    )
    with agent:
        agent.wait_log("bundle_waiting_for_labels")
        assert "reason=BundleNotInTarget" not in agent.current_run_log()
        kube.create_node(node, labels={"site": "line-3", "node-role.kubernetes.io/worker": ""})

        # Other tests on this machine plug sticks in too: judge this stick's entry only.
        def ours(status: dict[str, Any]) -> dict[str, Any] | None:
            mine = [b for b in status.get("bundles", []) if b.get("source") == media.devnode]
            return mine[-1] if mine and mine[-1]["state"] in ("rejected", "pinned") else None

        status = agent.wait_status(
            lambda s: (
                (ours(s) is not None and set_state(s, targeted.set_name) == "Pinned")
                or (ours(s) or {}).get("state") == "rejected"
            ),
            what="the targeted bundle imported and its set pinned (or refused)",
        )
        assert (ours(status) or {}).get("reason") is None, ours(status)
    assert await pinned(fresh_crio, targeted.refs) == targeted.refs
    kube.kubectl_ok("delete", "node", node)
