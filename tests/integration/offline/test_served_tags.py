"""A tag a ``--serve-tags`` bundle carries, through the real CRI-O, the registry stopped: the
kubelet's CRI sequence for ``imagePullPolicy: Always`` by tag succeeds, and the tag is frozen
at its signed digest while the mirror serves it, even once the registry is back with the tag
moved.

Real parts: a distribution registry, ``nodeagent bundle create --serve-tags`` with
``--image host/repo:tag@sha256:…``, the registry stopped, ``nodeagent bundle import`` into
CRI-O (which pulls the tag through the import's loopback mirror and its tag-only entry),
then the store served by the loopback server over the store's offer (``read_offer``: what
the always-on node mirror serves) with the tag-only drop-in (``render_mirror_dropin``'s
``tagged``), and real pods (tests/testenv/pods.py: pinns, runc, a static sleeper image).
The kubelet is not run: its calls are made as it makes them (ImageStatus, PullImage by the
pod's reference, RunPodSandbox, CreateContainer, StartContainer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.http.mirror import BundleServer
from nodeagent.adapters.store.offer import read_offer
from nodeagent.bundles import minisign
from nodeagent.bundles.mirror import render_mirror_dropin
from nodeagent.errors import NodeAgentError
from tests.testenv import pods
from tests.testenv.agent import Agent
from tests.testenv.bundles import make_bundle
from tests.testenv.crio import Crio
from tests.testenv.images import BuiltImage, push
from tests.testenv.registry import Registry

pytestmark = [
    pytest.mark.integration,
    pytest.mark.needs("pods"),
]

CATALOG = "nodeagent-test/catalog"
TAG = "v4.16"
NODE_MIRROR_DROPIN = "98-test-node-mirror.conf"
"""The stand-in for the node mirror's drop-in (issue 25, item 2), written by the test."""

ICSP_ENTRY = """
[[registry]]
prefix = "{repository}"
location = "{repository}"
insecure = true
mirror-by-digest-only = true

[[registry.mirror]]
location = "127.0.0.1:1/nodeagent-test/unreachable"
insecure = true
"""


def node(base: Path, crio: Crio, public: str) -> Agent:
    agent = Agent(base / "agent", crio)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(public)
    return agent


@dataclass(frozen=True)
class Made:
    bundle: Path
    public: str
    pause: str
    signed_digest: str


def make_tagged_bundle(tmp_path: Path, registry: Registry, built: dict[str, BuiltImage]) -> Made:
    """``bundle create --serve-tags`` of the pause image and the catalog, its tag signed."""
    public, secret = minisign.generate_keypair(comment="served tags test")
    with registry:
        host = registry.host
        pause = push(registry.url, "nodeagent-test/pause", built["pause"]).reference(host)
        signed = push(registry.url, CATALOG, built["signed"], tag=TAG)
        bundle = make_bundle(
            tmp_path, registry, [pause, signed.reference(host)], public, secret,
            images=[pause, f"{host}/{CATALOG}:{TAG}@{signed.digest}"],
            extra_args=["--serve-tags"],
        )  # fmt: skip
    doc = json.loads((bundle / "bundle.json").read_text())
    assert doc["servedTags"] == {f"{host}/{CATALOG}:{TAG}": signed.digest}
    return Made(bundle, public, pause, signed.digest)


def import_and_show(agent: Agent, bundle: Path, tag_ref: str, digest: str) -> None:
    """``bundle import``, then its frozen tag as the import, ``store --json`` and ``store``
    say it."""
    done = agent.cli("bundle", "import", str(bundle), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    frozen = json.loads(done.stdout)["frozenTags"]
    assert frozen == {tag_ref: digest}
    shown = agent.cli("store", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["bundles"][0]["frozenTags"] == frozen
    listed = agent.cli("store")
    assert f"frozen tag {tag_ref} -> {digest}" in listed.stdout


@pytest.mark.timeout(300)
async def test_always_by_tag_is_served_signed_and_frozen(tmp_path: Path) -> None:
    built = {
        name: pods.sleeper_image(tmp_path / name, label=name)
        for name in ("pause", "signed", "moved")
    }
    registry = Registry(tmp_path / "registry")
    made = make_tagged_bundle(tmp_path, registry, built)
    bundle, public, pause = made.bundle, made.public, made.pause
    host, signed_digest = registry.host, made.signed_digest
    tag_ref = f"{host}/{CATALOG}:{TAG}"

    runtime = pods.PodRuntime(pause_image=pause)
    with Crio(tmp_path / "crio", insecure_registries=[host], pods=runtime) as crio:
        agent = node(tmp_path, crio, public)
        # an ICSP-style entry for the repository: the import's drop-in restates it per
        # mirror (containers/image refuses a tag-only mirror beside mirror-by-digest-only)
        with crio.registries_conf.open("a") as conf:
            conf.write(ICSP_ENTRY.format(repository=f"{host}/{CATALOG}"))
        import_and_show(agent, bundle, tag_ref, signed_digest)
        async with CriClient(crio.endpoint, timeout_s=120) as cri:
            # the import pulled the tag through its mirror (the registry is stopped)
            stored = await cri.image_status(tag_ref)
            assert stored is not None and f"{host}/{CATALOG}@{signed_digest}" in stored.names()

            offer = read_offer(agent.state_dir / "store")
            assert offer.tags == {f"{CATALOG}/{TAG}": signed_digest}
            server = BundleServer(agent.state_dir / "store", offer.blobs, tags=offer.tags)
            async with server:
                dropin = crio.registries_dir / NODE_MIRROR_DROPIN
                repositories = [f"{host}/{CATALOG}", f"{host}/nodeagent-test/pause"]
                # digest-only, as for untagged bundles: a pull by tag never asks the mirror
                dropin.write_text(render_mirror_dropin(repositories, server.mirror_host))
                crio.reload()
                with pytest.raises(NodeAgentError, match="connection refused"):
                    await cri.pull_image(tag_ref, timeout_s=120)
                assert server.counters.requests == 0

                dropin.write_text(
                    render_mirror_dropin(
                        repositories, server.mirror_host, tagged=[f"{host}/{CATALOG}"]
                    )
                )
                crio.reload()

                # the kubelet, imagePullPolicy: Always, the pod naming the tag
                assert await cri.image_status(tag_ref) is not None
                served_before = server.counters.manifests_served
                pulled = await cri.pull_image(tag_ref, timeout_s=120)
                assert pulled == f"{host}/{CATALOG}@{signed_digest}"
                assert server.counters.manifests_served > served_before
                async with pods.Pods(crio.endpoint) as running:
                    await running.run(tag_ref, pod="catalog", namespace="olm")
                    listed = await cri.list_containers()
                    assert [(c.pod_namespace, c.pod_name) for c in listed] == [("olm", "catalog")]

                # the registry back, the tag moved there: still the signed digest
                with registry:
                    moved = push(registry.url, CATALOG, built["moved"], tag=TAG)
                    assert moved.digest != signed_digest
                    assert await cri.pull_image(tag_ref, timeout_s=120) == pulled

                    # without the node mirror the runtime follows the registry: the tag
                    # really moved, and only the mirror held it
                    dropin.unlink()
                    crio.reload()
                    repulled = await cri.pull_image(tag_ref, timeout_s=120)
                    assert repulled == f"{host}/{CATALOG}@{moved.digest}"
