"""The OS image of a release bundle, found and read offline where the MCD looks first.

The machine-config daemon, before rebasing a node to a new OS image (the release's
`rhel-coreos`, the MachineConfig's osImageURL), asks podman whether containers-storage holds
it (`podman images --format=json --filter reference=<osImageURL>`) and, if it does, rebases
with `rpm-ostree rebase --experimental ostree-unverified-image:containers-storage:<the
RepoDigests entry equal to the osImageURL>`; rpm-ostree reads the image through
`skopeo experimental-image-proxy` (docs/runtime-facts.md, "The OS image").

A synthetic release with its OS images (tests/testenv/release.py) is bundled, its registry
stopped, the bundle imported into the real CRI-O; then Debian's podman and skopeo, on
CRI-O's own storage.conf in a private mount namespace (tests/testenv/private_containers.py),
must (a) list the OS image by digest exactly as the MCD asks, with that RepoDigests entry,
(b) copy `containers-storage:<ref>` to an OCI layout, the manifest and config those of the
release, (c) open it through the image proxy with the protocol rpm-ostree speaks
(tests/testenv/image_proxy.py) and read its manifest and its layer, (d) still find it after
CRI-O reloads the pins, the OS image pinned by the release set, and (e) be refused it under a
restrictive policy.json unless the MCD's temporary rule for that image is added
(OCPBUGS-62714).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.integration.bundles.test_create_verify import make_keys, run_cli
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.image_proxy import ImageProxy, ProxyError
from tests.testenv.packages import PACKAGES, ensure_packages
from tests.testenv.private_containers import PrivateContainers
from tests.testenv.registry import Registry
from tests.testenv.release import (
    OS_EXTENSIONS_TAG,
    OS_IMAGE_LABELS,
    OS_IMAGE_TAG,
    SyntheticRelease,
    push_release,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

VERSION = "4.99.3"
OLD_PROXY = {"0.2.1", "0.2.2", "0.2.3", "0.2.4"}
"""Image proxy protocols without GetLayerInfo (Debian 12's skopeo 1.9.3 speaks 0.2.3)."""


@dataclass(frozen=True)
class Node:
    release: SyntheticRelease
    crio: Crio
    agent: Agent
    tools: PrivateContainers
    work: Path

    def podman_images(self, reference: str) -> list[dict[str, Any]]:
        """What the MCD runs (pkg/daemon/podman.go GetPodmanImageInfoByReference)."""
        done = self.tools.run("podman", "images", "--format=json", "--filter",
                              f"reference={reference}")  # fmt: skip
        assert done.returncode == 0, done.stderr
        found: list[dict[str, Any]] = json.loads(done.stdout or "[]")
        return found


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """The release bundled from its registry, the registry stopped, the bundle imported."""
    ensure_packages({name: PACKAGES[name] for name in ("podman", "skopeo")})
    work = tmp_path_factory.mktemp("os-image")
    keys = make_keys(work / "keys")
    with Registry(work / "registry") as registry:
        release = push_release(
            registry.url, registry.host, work, version=VERSION, payload_count=1, os_image=True
        )
        created = run_cli(
            "bundle", "create", "--release", release.ref, "--key", keys.key, "--output",
            work / "bundle", "--insecure-registry", registry.host, "--arch", "amd64",
            "--id", "os-image-test",
        )  # fmt: skip
        assert created.code == 0, created.err
    # The registry is stopped: nothing below can reach it.
    with Crio(work / "crio", insecure_registries=[registry.host]) as crio:
        agent = Agent(work / "agent", crio)
        agent.write_config()
        agent.trusted_keys_dir.mkdir(parents=True)
        shutil.copy(keys.pub, agent.trusted_keys_dir / "factory.pub")
        imported = agent.cli("bundle", "import", str(work / "bundle"), "--json")
        assert imported.returncode == 0, imported.stdout + imported.stderr
        tools = PrivateContainers(work / "tools", crio.storage_conf)
        yield Node(release, crio, agent, tools, work)


def test_the_release_names_its_os_images_as_openshift_does(node: Node) -> None:
    bundled = json.loads((node.work / "bundle" / "bundle.json").read_text())
    (carried,) = bundled["pinnedImageSets"]
    pinned = [item["name"] for item in carried["object"]["spec"]["pinnedImages"]]
    assert node.release.os_image in pinned
    assert node.release.payload[OS_EXTENSIONS_TAG] in pinned
    assert node.release.os_image.split("@")[0].endswith(f"/ocp/{OS_IMAGE_TAG}")


def test_podman_lists_the_os_image_by_digest_as_the_mcd_asks(node: Node) -> None:
    for reference in (node.release.os_image, node.release.payload[OS_EXTENSIONS_TAG]):
        found = node.podman_images(reference)
        assert len(found) == 1, found
        # The MCD rebases from the RepoDigests entry equal to the reference: it must exist.
        assert reference in found[0]["RepoDigests"], found[0]
    host = node.release.host
    absent = f"{host}/ocp/{OS_IMAGE_TAG}@sha256:{'0' * 64}"
    assert node.podman_images(absent) == []  # a digest not held: the MCD would pull


def test_skopeo_copies_the_os_image_out_of_containers_storage(node: Node) -> None:
    out = node.tools.base / "oci"
    source = f"containers-storage:{node.release.os_image}"
    done = node.tools.run("skopeo", "copy", "--quiet", source, f"oci:{out}:os")
    assert done.returncode == 0, done.stderr
    index = json.loads((out / "index.json").read_text())
    (descriptor,) = index["manifests"]
    configs, manifests = node.release.os_image_configs, node.release.os_image_index
    assert configs is not None and manifests is not None
    manifest = json.loads(blob(out, descriptor["digest"]))
    # The same image (its config, hence its image ID and diff_ids, byte for byte) for the
    # node's architecture; the manifest is a new one: containers-storage keeps layers
    # uncompressed and the copy compresses them again (docs/runtime-facts.md).
    assert manifest["config"]["digest"] == configs["amd64"]
    config = json.loads(blob(out, configs["amd64"]))
    assert config["architecture"] == "amd64"
    assert config["config"]["Labels"] == OS_IMAGE_LABELS
    assert descriptor["digest"] != manifests["amd64"]
    preserved = f"oci:{node.tools.base / 'oci-preserved'}:os"
    copied = node.tools.run("skopeo", "copy", "--quiet", "--preserve-digests", source, preserved)
    # The original compressed layers are not in containers-storage: no byte-identical copy.
    assert copied.returncode != 0
    assert "changing layer representation" in copied.stderr


def blob(layout: Path, digest: str) -> bytes:
    algorithm, hex_part = digest.split(":")
    return (layout / "blobs" / algorithm / hex_part).read_bytes()


def test_the_image_proxy_rpm_ostree_uses_reads_the_os_image(node: Node) -> None:
    reference = f"containers-storage:{node.release.os_image}"
    wrapped = node.tools.command
    with ImageProxy(lambda fd: wrapped(["skopeo", "experimental-image-proxy", "--sockfd",
                                        str(fd)]), env=node.tools.env()) as proxy:  # fmt: skip
        version = proxy.initialize()
        handle = proxy.open_image(reference)
        digest, raw = proxy.get_manifest(handle)
        manifest = json.loads(raw)
        (layer,) = manifest["layers"]
        compressed = blob(node.work / "bundle", layer["digest"])
        uncompressed = gzip.decompress(compressed)
        diff_id = "sha256:" + hashlib.sha256(uncompressed).hexdigest()
        # The layer as stored (uncompressed), by its diff_id: what rpm-ostree reads.
        assert proxy.get_blob(handle, diff_id, len(uncompressed)) == uncompressed
        if version in OLD_PROXY:
            # The manifest's compressed digest is not in containers-storage, and this proxy
            # has no GetLayerInfo to say so (protocol 0.2.5 added it: docs/runtime-facts.md).
            with pytest.raises(ProxyError, match="locating item named"):
                proxy.get_blob(handle, layer["digest"], layer["size"])
        proxy.close_image(handle)
        assert proxy.close() == 0
    manifests = node.release.os_image_index
    assert manifests is not None
    assert digest == manifests["amd64"]  # the original manifest's digest, for the node's arch
    assert manifest["config"]["digest"] == (node.release.os_image_configs or {}).get("amd64")


async def test_the_os_image_stays_pinned_in_containers_storage(node: Node) -> None:
    status = node.agent.status()
    assert status is not None
    assert set_state(status, f"release-{VERSION}") == "Pinned"
    rendered = "".join(path.read_text() for path in sorted(node.crio.dropin_dir.iterdir()))
    assert node.release.os_image in rendered  # CRI-O's pinned_images: the GC keeps it
    node.crio.reload()
    async with CriClient(node.crio.endpoint) as cri:
        image = await cri.image_status(node.release.os_image)
    assert image is not None and image.is_pinned
    assert node.release.os_image in node.podman_images(node.release.os_image)[0]["RepoDigests"]


def test_a_restrictive_policy_refuses_it_unless_the_mcd_s_temporary_rule_allows_it(
    node: Node,
) -> None:
    """OCPBUGS-62714: with `default: reject`, containers-storage is refused; the MCD's
    temporary rule (pkg/daemon/rpm-ostree.go, `[<driver>@<graphRoot>]<RepoDigest>@<Id>` from
    `podman system info` and `podman images`) lets exactly this image through."""
    info = node.tools.run("podman", "system", "info", "--format=json")
    assert info.returncode == 0, info.stderr
    store = json.loads(info.stdout)["store"]
    (image,) = node.podman_images(node.release.os_image)
    key = f"[{store['graphDriverName']}@{store['graphRoot']}]{node.release.os_image}@{image['Id']}"
    allow = [{"type": "insecureAcceptAnything"}]
    other = node.release.payload[OS_EXTENSIONS_TAG]
    for name, transports, reference, allowed in (
        ("reject", {}, node.release.os_image, False),
        ("mcd", {"containers-storage": {key: allow}}, node.release.os_image, True),
        ("mcd", {"containers-storage": {key: allow}}, other, False),  # only that image
    ):
        policy = node.tools.base / f"policy-{name}.json"
        policy.write_text(json.dumps({"default": [{"type": "reject"}], "transports": transports}))
        copied = node.tools.run(
            "skopeo", "--policy", str(policy), "copy", "--quiet",
            f"containers-storage:{reference}", f"oci:{node.tools.base / 'policy-out'}:{name}",
        )  # fmt: skip
        assert (copied.returncode == 0) is allowed, (name, reference, copied.stderr)
        if not allowed:
            assert "rejected by policy" in copied.stderr
