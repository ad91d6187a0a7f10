"""The demo's node: a registry, udevd, CRI-O and the daemon; pinning from the registry, a
signed bundle on a stick with the registry stopped, and a power cut that wipes CRI-O.

Every part is the test environment's (``tests/testenv``): ``Registry``, ``Udevd`` with
``LoopMedia`` sticks, ``Crio``, ``Agent`` (the real ``nodeagent run``), ``build_factory``
(``nodeagent bundle create`` against a registry of its own, stopped once the bundle is
signed). The daemon keeps registry sets in its node store (``[store] registry_sets``), so
after the power cut every pinned image comes back from the store, none from a registry.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.testenv.agent import Agent, set_state
from tests.testenv.bundles import Factory, build_factory, ext4_media
from tests.testenv.crio import Crio
from tests.testenv.demo.metrics import metrics_config
from tests.testenv.demo.story import Story
from tests.testenv.images import make_image_set, push
from tests.testenv.registry import Registry
from tests.testenv.udev import Udevd
from tests.testenv.waiting import wait_for

SET_NAME = "demo-apps"
STORE_CONFIG = "\n[store]\nregistry_sets = true\n"


@dataclass
class DemoNode:
    """The node's parts, running, and where its metrics are scraped."""

    registry: Registry
    udevd: Udevd
    crio: Crio
    agent: Agent
    refs: list[str]
    metrics_url: str


def make_factory(workdir: Path, story: Story) -> Factory:
    with story.chapter("a factory makes a signed bundle (nodeagent bundle create)"):
        story.explain(
            """At the factory, `nodeagent bundle create` copies images from a registry into an
            OCI layout and signs its manifest with a minisign key. The factory's registry is
            stopped afterwards: the nodes below never reach it."""
        )
        factory = build_factory(workdir, count=3, layer_bytes=2 << 20, seed=18)
        story.say(f"    bundle at {factory.bundle}, set {factory.set_name}, 3 images:")
        for ref in factory.refs:
            story.say(f"      {ref}")
    return factory


@contextmanager
def demo_node(base: Path, story: Story, factory: Factory) -> Iterator[DemoNode]:
    """Start the registry (5 images pushed), udevd and CRI-O; write the daemon's config."""
    with ExitStack() as stack:
        with story.chapter("starting a private OCI registry on loopback, pushing 5 images"):
            registry = stack.enter_context(Registry(base / "registry"))
            images = make_image_set(
                5, layer_size_bytes=2 << 20, shared_base_size_bytes=4 << 20, seed=7
            )
            refs = [
                push(registry.url, i.repository, i.build()).reference(registry.host) for i in images
            ]
            story.say(f"    registry at {registry.url}; images pushed by digest")
        with story.chapter("starting systemd-udevd (it announces sticks) and CRI-O"):
            udevd = stack.enter_context(Udevd(base / "udevd"))
            crio = stack.enter_context(Crio(base / "crio", insecure_registries=[registry.host]))
            story.say(
                f"    CRI-O answers on {crio.endpoint} (its own storage under {crio.storage_root})"
            )
        agent = Agent(base / "agent", crio, watch_media=True)
        agent.write_config()
        metrics_url, metrics_toml = metrics_config()
        agent.extra_config = STORE_CONFIG + metrics_toml
        agent.write_config()
        agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
        (agent.trusted_keys_dir / "factory.pub").write_text(factory.public_key)
        stack.callback(agent.__exit__, None, None, None)
        yield DemoNode(registry, udevd, crio, agent, refs, metrics_url)


def pin_from_registry(node: DemoNode, story: Story) -> None:
    agent = node.agent
    with story.chapter("a. pinning a set of images from the registry"):
        story.explain(
            f"""A PinnedImageSet names images by digest. nodeagent checks the disk has room,
            pulls each image through CRI-O, writes CRI-O's pin file and reloads CRI-O: the
            kubelet's image garbage collection can no longer remove them. With [store]
            registry_sets on, as here, each image is fetched once into the node's own store
            and CRI-O pulls it from there (source=store below), so it can be restored without
            the registry later. The set goes into {agent.persistent_dir}."""
        )
        agent.write_set(SET_NAME, node.refs)
        mark = len(agent.log_text())
        agent.start()
        agent.wait_status(lambda s: set_state(s, SET_NAME) == "Pinned", what=f"{SET_NAME} pinned")
        story.pinned_first()
        events = ("daemon_started", "pulls_started", "image_pulled", "pins_written", "set_pinned")
        story.journal(agent.log_text()[mark:], events)
        story.milestone(f"set {SET_NAME} pinned from the registry ({len(node.refs)} images)")


def bundle_entry(status: dict[str, Any], source: str) -> dict[str, Any]:
    """The last bundle the status reports from ``source`` (a device node), or ``{}``."""
    found = [b for b in status.get("bundles", []) if b.get("source") == source]
    return dict(found[-1]) if found else {}


def import_from_stick(node: DemoNode, story: Story, factory: Factory, workdir: Path) -> None:
    agent = node.agent
    with story.chapter("b. a signed bundle on a USB stick, the registry stopped"):
        node.registry.stop()
        story.explain(
            """The registry is stopped now. The factory's bundle is put on an ext4 file system
            labelled NODEAGENT1 and attached as a loop device: to the kernel and udev, a stick
            plugged in. nodeagent mounts it read-only, checks the signature against its trusted
            keys, copies every blob into its node store, checking each digest, and then says
            the stick may be removed. The import continues from the store."""
        )
        workdir.mkdir(parents=True, exist_ok=True)
        stick = ext4_media(workdir, factory.bundle)
        mark = len(agent.log_text())
        try:
            devnode = stick.attach()
            story.say(f"    stick plugged in: {devnode}")
            agent.wait_status(
                lambda s: bundle_entry(s, devnode).get("mediumRemovable") is True,
                what="the status saying the stick may be removed",
            )
            story.milestone(
                f"you may remove the stick ({devnode}): the bundle is in the node store"
            )
            stick.unplug()
            story.say("    stick pulled out")
        finally:
            stick.unplug()
            stick.image.unlink(missing_ok=True)
        agent.wait_status(
            lambda s: set_state(s, factory.set_name) == "Pinned",
            what=f"{factory.set_name} pinned from the stick",
        )
        events = (
            "bundle_media_detected", "bundle_verified", "bundle_admitted", "store_copy_started",
            "bundle_stored", "media_unmounted", "bundle_importing", "bundle_imported", "set_pinned",
        )  # fmt: skip
        story.journal(agent.log_text()[mark:], events)
        story.milestone(f"set {factory.set_name} pinned from the stick, with no registry")


def power_cut(node: DemoNode, story: Story, factory: Factory) -> None:
    agent, crio = node.agent, node.crio
    with story.chapter("c. a power cut: CRI-O's image storage is lost"):
        story.explain(
            """After an unclean shutdown CRI-O may wipe its image storage. Here CRI-O is killed,
            its storage deleted, and it is started again, with no registry and no stick.
            nodeagent notices the pinned images are gone and restores them from its node
            store, then pins them again."""
        )
        mark = len(agent.log_text())
        crio.kill()
        shutil.rmtree(crio.storage_root)
        story.say(f"    CRI-O killed, {crio.storage_root} deleted; CRI-O started again")
        crio.start()
        wait_for(
            lambda: "images_restored_from_store" in agent.log_text()[mark:],
            timeout_s=120,
            what="the images restored from the node store",
            detail=agent.current_run_log,
        )
        sets = (SET_NAME, factory.set_name)
        status = agent.wait_status(
            lambda s: "imageLoss" in s and all(set_state(s, n) == "Pinned" for n in sets),
            what="both sets pinned again",
        )
        events = (
            "runtime_socket_appeared", "pinned_images_lost", "restore_started",
            "images_restored_from_store", "pinned_images_back", "pins_restored", "set_pinned",
        )  # fmt: skip
        story.journal(agent.log_text()[mark:], events)
        restored = status["imageLoss"].get("restoredFromStore")
        story.milestone(f"{restored} images restored from the node store, none from a registry")
