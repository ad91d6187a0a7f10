"""A synthetic OpenShift release, bundled from the real registry, carried to a node, pinned.

The release (tests/testenv/release.py) is a multi-arch index over an amd64 and an arm64
release image whose top layer holds `release-manifests/image-references` and
`release-metadata`, with payload images that are multi-arch indexes too; its signature is a
real OpenPGP message made with gpg over the "atomic container signature" document. The
test checks the signature inside the ConfigMap with `gpgv` and only the test key, and that
its `critical.image.docker-manifest-digest` is the release digest: what the cluster-version
operator checks. The import runs against the real CRI-O after the registry is stopped.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.integration.bundles.test_create_verify import Keys, make_keys, run_cli, verify
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.registry import Registry
from tests.testenv.release import (
    SyntheticRelease,
    TestGpg,
    push_release,
    signature_document,
    verify_signature,
    write_signature_store,
)

pytestmark = pytest.mark.integration

VERSION = "4.99.1"
PREVIOUS = ("4.98.7", "4.99.0")
PAYLOAD_COUNT = 5


@dataclass(frozen=True)
class Made:
    release: SyntheticRelease
    gpg: TestGpg
    keys: Keys
    bundle: Path
    registry: Registry
    work: Path

    def create(self, output: Path, *args: str | Path) -> tuple[int, str, str]:
        result = run_cli(
            "bundle", "create", "--release", self.release.ref, "--key", self.keys.key,
            "--output", output, "--insecure-registry", self.registry.host, *args,
        )  # fmt: skip
        return result.code, result.out, result.err


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Made]:
    """The release in a registry of its own (stopped by the import test), signed, bundled."""
    work = tmp_path_factory.mktemp("release")
    gpg = TestGpg.make(work / "gnupg")
    with Registry(work / "registry") as registry:
        release = push_release(
            registry.url, registry.host, work, version=VERSION, payload_count=PAYLOAD_COUNT,
            previous=PREVIOUS,
        )  # fmt: skip
        signature = gpg.sign(signature_document(release))
        store = write_signature_store(work / "signatures", release.digest, [signature])
        keys = make_keys(work / "keys")
        made = Made(release, gpg, keys, work / "bundle", registry, work)
        code, out, err = made.create(
            made.bundle, "--signature-dir", store, "--arch", "amd64", "--id", "release-test"
        )
        assert code == 0, err
        assert f"release {VERSION}: {PAYLOAD_COUNT} payload images" in out
        code, _, err = made.create(
            made.work / "again", "--signature-dir", store, "--arch", "amd64", "--id", "again",
            "--channel", "again",  # made in the same second: its own line, not a rollback
        )  # fmt: skip
        assert code == 0, err
        yield made
    gpg.close()


def bundle_doc(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((path / "bundle.json").read_text())
    return doc


def test_the_release_and_every_payload_image_are_bundled_with_a_release_set(made: Made) -> None:
    doc = bundle_doc(made.bundle)
    names = {image["name"] for image in doc["images"]}
    assert names == {made.release.ref, *made.release.payload.values()}
    (carried,) = doc["pinnedImageSets"]
    assert carried["object"]["metadata"]["name"] == f"release-{VERSION}"
    pinned = [item["name"] for item in carried["object"]["spec"]["pinnedImages"]]
    assert pinned == [made.release.ref, *made.release.payload.values()]
    assert doc["formatVersion"] == 3
    release = doc["release"]
    hex_part = made.release.digest.removeprefix("sha256:")
    assert release == {
        "image": made.release.ref, "version": VERSION, "set": f"release-{VERSION}",
        "signatures": [{
            "digest": made.release.digest, "index": 1,
            "path": f"release-signatures/sha256-{hex_part}-1",
            "sizeBytes": (made.bundle / f"release-signatures/sha256-{hex_part}-1").stat().st_size,
            "sha256": release["signatures"][0]["sha256"],
        }],
        "previous": list(PREVIOUS),
    }  # fmt: skip
    assert verify(made.bundle, made.keys).code == 0


@pytest.mark.parametrize(
    ("from_version", "said"),
    [
        ("4.98.6", "does not upgrade from the cluster's version 4.98.6"),
        ("4.99.2", "is older than the cluster's version 4.99.2"),  # never a downgrade
        ("4.99", "is not a semantic version"),
    ],
)
def test_from_version_refuses_a_release_that_does_not_upgrade_it(
    made: Made, from_version: str, said: str
) -> None:
    """At the factory: nothing is written, the message names both versions."""
    output = made.work / f"refused-{from_version}"
    code, _, err = made.create(output, "--arch", "amd64", "--from-version", from_version)
    assert code == 65, err
    assert "ReleaseNotAnUpgrade" in err or "ReleaseVersionInvalid" in err
    assert said in err and from_version in err
    assert not (output / "bundle.json").exists()


def test_from_version_listed_in_previous_makes_the_bundle(made: Made) -> None:
    output = made.work / "from-4.99.0"
    code, _, err = made.create(
        output, "--arch", "amd64", "--from-version", "4.99.0", "--id", "from", "--channel", "from"
    )
    assert code == 0, err
    assert bundle_doc(output)["release"]["previous"] == list(PREVIOUS)


def test_the_architecture_picks_the_release_image_of_a_multi_arch_release(made: Made) -> None:
    blobs = {b["digest"] for b in bundle_doc(made.bundle)["blobs"]}
    assert made.release.children["amd64"] in blobs
    assert made.release.children["arm64"] not in blobs
    output = made.work / "arm64"
    code, out, err = made.create(output, "--arch", "arm64", "--release-set-name", "ocp-next")
    assert code == 0, err
    assert "set ocp-next, 0 signatures" in out
    doc = bundle_doc(output)
    arm_blobs = {b["digest"] for b in doc["blobs"]}
    assert made.release.children["arm64"] in arm_blobs
    assert made.release.children["amd64"] not in arm_blobs
    assert doc["architecture"] == "arm64"
    assert doc["release"]["set"] == "ocp-next"
    assert doc["release"]["signatures"] == []
    assert verify(output, made.keys, "--arch", "arm64").code == 0


def test_the_config_map_carries_a_signature_the_cvo_would_accept(made: Made) -> None:
    out = made.work / "signatures.json"
    result = run_cli(
        "bundle", "release-signatures", made.bundle, "--trusted-keys", made.keys.trusted_dir,
        "--json", "--output", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    config_map = json.loads(out.read_text())
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["namespace"] == "openshift-config-managed"
    assert config_map["metadata"]["labels"] == {"release.openshift.io/verification-signatures": ""}
    hex_part = made.release.digest.removeprefix("sha256:")
    assert list(config_map["binaryData"]) == [f"sha256-{hex_part}-1"]
    signature = base64.b64decode(config_map["binaryData"][f"sha256-{hex_part}-1"])
    signed = verify_signature(signature, made.gpg.public_keyring, made.work / "gpgv")
    assert signed["critical"]["type"] == "atomic container signature"
    assert signed["critical"]["image"]["docker-manifest-digest"] == made.release.digest


def test_the_config_map_as_yaml_is_the_same_object(made: Made) -> None:
    yaml_out = run_cli(
        "bundle", "release-signatures", made.bundle, "--trusted-keys", made.keys.trusted_dir
    )
    json_out = run_cli(
        "bundle", "release-signatures", made.bundle, "--trusted-keys", made.keys.trusted_dir,
        "--json",
    )  # fmt: skip
    import yaml  # the project's YAML reader's dependency

    assert yaml.safe_load(yaml_out.out) == json.loads(json_out.out)


def test_a_changed_signature_file_is_refused_by_verify_and_the_config_map(made: Made) -> None:
    copy = made.work / "tampered"
    shutil.copytree(made.bundle, copy)
    (signature,) = (copy / "release-signatures").iterdir()
    data = bytearray(signature.read_bytes())
    data[-1] ^= 1
    signature.write_bytes(bytes(data))
    checked = verify(copy, made.keys, "--json")
    assert checked.code == 65
    assert checked.json()["error"]["reason"] == "BundleDigestMismatch"
    result = run_cli("bundle", "release-signatures", copy, "--trusted-keys", made.keys.trusted_dir)
    assert result.code == 65
    assert "BundleDigestMismatch" in result.err
    assert result.out == ""


async def test_imported_with_no_registry_pinned_and_the_next_steps_said(
    made: Made, fresh_crio: Crio, tmp_path: Path
) -> None:
    made.registry.stop()
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True)
    shutil.copy(made.keys.pub, agent.trusted_keys_dir / "factory.pub")
    imported = agent.cli("bundle", "import", str(made.bundle), "--json")
    assert imported.returncode == 0, imported.stdout + imported.stderr
    status = agent.status()
    assert status is not None
    assert set_state(status, f"release-{VERSION}") == "Pinned"
    async with CriClient(fresh_crio.endpoint) as cri:
        found = [await cri.image_status(ref) for ref in made.release.payload.values()]
        release_image = await cri.image_status(made.release.ref)
    assert all(image is not None and image.is_pinned for image in found)
    assert release_image is not None and release_image.is_pinned
    # The journal line (release_pinned), on stderr here: this node is ready; a standalone
    # node cannot know the others, and never says to start the upgrade (decision 0073).
    ready = "this node is ready; how many other nodes are ready is not known to this node"
    assert ready in imported.stderr
    assert "oc adm upgrade" not in imported.stderr + imported.stdout
    assert "release_signatures_not_applied" in imported.stderr  # standalone: by hand
    shown = agent.cli("status")
    assert f"next: release {VERSION} is pinned on this node" in shown.stdout
    assert f"next: {ready}" in shown.stdout, shown.stdout
    assert "oc adm upgrade" not in shown.stdout
    assert "nodeagent site status --bundle release-test --set release-4.99.1" in shown.stdout
    # The node store keeps the signatures: the ConfigMap from the bundle id alone.
    by_id = agent.cli("bundle", "release-signatures", "release-test", "--json")
    assert by_id.returncode == 0, by_id.stderr
    assert json.loads(by_id.stdout)["metadata"]["namespace"] == "openshift-config-managed"
    # The same release again under another id: every blob is stored, the signatures too.
    again = agent.cli("bundle", "import", str(made.work / "again"), "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    again_map = agent.cli("bundle", "release-signatures", "again", "--json")
    assert again_map.returncode == 0, again_map.stderr
    assert json.loads(again_map.stdout) == json.loads(by_id.stdout) | {
        "metadata": json.loads(by_id.stdout)["metadata"]
        | {"annotations": json.loads(again_map.stdout)["metadata"]["annotations"]}
    }
