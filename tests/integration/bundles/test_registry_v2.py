"""A bundle whose content is a distribution registry's own storage (the registry v2 layout).

OpenShift's release media carry registry data in that layout; nodeagent accepts it beside the
OCI layout. Here the storage directory of a real docker-registry becomes the bundle.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from nodeagent.adapters.cri.client import CriClient
from nodeagent.bundles import minisign
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.registry import Registry

BLOBS = "docker/registry/v2/blobs/sha256/"


def registry_v2_bundle(storage: Path, out: Path, images: list[dict[str, object]], key: str) -> None:
    shutil.copytree(storage, out)
    for directory in sorted(out.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()  # e.g. _uploads: empty directories are not part of a bundle
    blobs, files = [], []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = path.relative_to(out).as_posix()
        if rel.startswith(BLOBS) and rel.endswith("/data"):
            blobs.append(
                {"digest": "sha256:" + rel.split("/")[-2], "sizeBytes": path.stat().st_size}
            )
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            files.append({"path": rel, "sha256": digest, "sizeBytes": path.stat().st_size})
    refs = [str(image["name"]) for image in images]
    set_doc = {
        "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "PinnedImageSet",
        "metadata": {"name": "release"},
        "spec": {"pinnedImages": [{"name": ref} for ref in refs]},
    }  # fmt: skip
    manifest = {
        "formatVersion": 1, "bundleId": "release-v2-layout", "created": "2026-11-22T00:00:00Z",
        "architecture": "amd64", "layout": "registry-v2", "images": images, "blobs": blobs,
        "files": files, "pinnedImageSets": [{"persistent": True, "object": set_doc}],
    }  # fmt: skip
    data = json.dumps(manifest, indent=1).encode()
    (out / "bundle.json").write_bytes(data)
    signature = minisign.sign(
        data, minisign.parse_secret_key(key), trusted_comment="release media test"
    )
    (out / "bundle.json.minisig").write_text(signature)


async def test_registry_v2_layout_bundle_verifies_and_imports_without_registry(
    fresh_crio: Crio, tmp_path: Path
) -> None:
    public, secret = minisign.generate_keypair(comment="release signing")
    with Registry(tmp_path / "release-registry") as registry:
        base = LayerSpec(96 * 1024, seed=701)
        built = [
            TestImage(f"ocp/release-{n}", [base, LayerSpec(64 * 1024, seed=702 + n)]).build()
            for n in range(2)
        ]
        pushed = [push(registry.url, b.repository, b) for b in built]
        images: list[dict[str, object]] = [
            {"name": p.reference(registry.host), "manifestDigest": p.digest,
             "sizeBytes": b.manifest.size_bytes + p.total_size_bytes}  # manifest, config, layers
            for p, b in zip(pushed, built, strict=True)
        ]  # fmt: skip
        storage = registry.root
    bundle = tmp_path / "media"
    registry_v2_bundle(storage, bundle, images, secret)
    refs = [str(image["name"]) for image in images]

    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True)
    (agent.trusted_keys_dir / "release.pub").write_text(public)
    verified = agent.cli("bundle", "verify", str(bundle))
    assert verified.returncode == 0, verified.stdout + verified.stderr

    imported = agent.cli("bundle", "import", str(bundle), "--json")
    assert imported.returncode == 0, imported.stdout + imported.stderr
    report = json.loads(imported.stdout[imported.stdout.index("{") :])
    assert report["state"] == "imported"
    assert report["pinnedImageSets"] == ["release"]
    status = agent.status()
    assert status is not None
    assert set_state(status, "release") == "Pinned"
    async with CriClient(fresh_crio.endpoint) as cri:
        found = [await cri.image_status(ref) for ref in refs]
    assert [image is not None and image.is_pinned for image in found] == [True, True]
    assert list(agent.persistent_dir.glob("bundle-release-v2-layout-release.yaml"))
