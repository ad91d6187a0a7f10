"""A bundle carries its images' sigstore signatures, and a CRI-O that requires them pulls every
image from it with no registry.

Real parts: a distribution registry holding the images and their signatures (made here with a
test P-256 key, tests/testenv/sigstore.py), ``nodeagent bundle create --with-signatures``,
CRI-O v1.34 whose policy.json requires ``sigstoreSigned`` with that key for the registry, and
``nodeagent bundle import`` after the registry was stopped: the images come from the
loopback mirror only.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.bundles import minisign
from nodeagent.bundles.signatures import signature_tag
from tests.testenv.agent import Agent, set_state
from tests.testenv.bundles import make_bundle
from tests.testenv.crio import Crio
from tests.testenv.registry import Registry
from tests.testenv.sigstore import SigningKey, push_signed_images


@dataclass(frozen=True)
class SignedBundles:
    signed: Path
    unsigned: Path
    refs: list[str]
    registry_host: str
    minisign_public: str
    sigstore_key: SigningKey
    signature_digests: dict[str, str]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> SignedBundles:
    """Two images signed in a registry, bundled with and without their signatures; the
    registry is stopped before any test imports them."""
    workdir = tmp_path_factory.mktemp("sigstore")
    public, secret = minisign.generate_keypair(comment="sigstore test")
    key = SigningKey()
    with Registry(workdir / "registry") as registry:
        refs, digests = push_signed_images(
            registry, key, count=2, layer_bytes=256 << 10, base_bytes=128 << 10, seed=414
        )
        for name in ("signed", "unsigned"):
            (workdir / name).mkdir()
        started = time.monotonic()
        signed = make_bundle(workdir / "signed", registry, refs, public, secret,
                             extra_args=["--with-signatures"])  # fmt: skip
        # the unsigned twin has its own channel: made after the signed one, it would
        # otherwise be the newer bundle of the line, and the signed one a rollback
        seconds = time.monotonic() - started
        started = time.monotonic()
        unsigned = make_bundle(workdir / "unsigned", registry, refs, public, secret,
                               extra_args=["--id", "line-3-unsigned",
                                           "--channel", "unsigned"])  # fmt: skip
        print(f"bundle create: {seconds:.2f} s with signatures, "
              f"{time.monotonic() - started:.2f} s without (2 images)")  # fmt: skip
        host = registry.host
    return SignedBundles(signed, unsigned, refs, host, public, key, digests)


def runtime(base: Path, bundles: SignedBundles, *, registries_d: dict[str, str]) -> Crio:
    """A CRI-O that accepts images of the test registry only with a valid sigstore signature
    (``matchRepository``: cosign signs the repository name, which ``matchRepoDigestOrExact``
    refuses, docs/runtime-facts.md)."""
    key_file = bundles.sigstore_key.write_public(base / "keys" / "sigstore.pub")
    required = [{"type": "sigstoreSigned", "keyPath": str(key_file),
                 "signedIdentity": {"type": "matchRepository"}}]  # fmt: skip
    policy = {
        "default": [{"type": "insecureAcceptAnything"}],
        "transports": {"docker": {bundles.registry_host: required}},
    }
    return Crio(base / "crio", insecure_registries=[bundles.registry_host], policy=policy,
                registries_d=registries_d)  # fmt: skip


def agent_for(base: Path, crio: Crio, bundles: SignedBundles) -> Agent:
    agent = Agent(base / "agent", crio)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(bundles.minisign_public)
    return agent


def imported(agent: Agent, bundle: Path) -> tuple[int, dict[str, Any]]:
    done = agent.cli("bundle", "import", str(bundle), "--json")
    start = done.stdout.find("{")
    assert start >= 0, done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout[start : done.stdout.rindex("}") + 1])


async def present(crio: Crio, refs: list[str]) -> list[str]:
    async with CriClient(crio.endpoint) as cri:
        return [ref for ref in refs if await cri.image_status(ref) is not None]


def test_the_signed_bundle_lists_each_signature_and_its_blobs(bundles: SignedBundles) -> None:
    doc = json.loads((bundles.signed / "bundle.json").read_text())
    assert doc["formatVersion"] == 3
    listed = {blob["digest"] for blob in doc["blobs"]}
    entries = {entry["image"]: entry for entry in doc["imageSignatures"]}
    assert sorted(entries) == sorted(bundles.refs)
    for ref, entry in entries.items():
        assert entry["tag"] == signature_tag(ref.rpartition("@")[2])
        assert entry["manifest"] == bundles.signature_digests[ref]
        assert entry["manifest"] in listed
        manifest = json.loads(
            (bundles.signed / "blobs/sha256" / entry["manifest"][7:]).read_bytes()
        )
        assert {layer["digest"] for layer in manifest["layers"]} <= listed
    unsigned = json.loads((bundles.unsigned / "bundle.json").read_text())
    assert unsigned["formatVersion"] == 3  # what bundle create writes (a sequence)
    assert "imageSignatures" not in unsigned


async def test_a_runtime_requiring_signatures_pulls_every_image_from_the_bundle_offline(
    bundles: SignedBundles, tmp_path: Path
) -> None:
    scope = f"docker:\n  {bundles.registry_host}:\n    use-sigstore-attachments: true\n"
    with runtime(tmp_path, bundles, registries_d={"test-registry.yaml": scope}) as crio:
        agent = agent_for(tmp_path, crio, bundles)
        verified = agent.cli("bundle", "verify", str(bundles.signed))
        assert verified.returncode == 0, verified.stderr
        assert verified.stdout.count("sigstore signature carried") == 2
        shown = json.loads(agent.cli("bundle", "verify", "--json", str(bundles.signed)).stdout)
        assert sorted(e["image"] for e in shown["imageSignatures"]) == sorted(bundles.refs)
        code, report = imported(agent, bundles.unsigned)
        assert code == 65, report  # the policy bites: no signature, no image
        assert await present(crio, bundles.refs) == []

        code, report = imported(agent, bundles.signed)
        assert code == 0, report.get("message")
        assert report["state"] == "imported"
        assert "warnings" not in report
        assert await present(crio, bundles.refs) == bundles.refs
        assert sorted(p.name for p in crio.registries_d_dir.iterdir()) == ["test-registry.yaml"]


async def test_without_a_registries_d_entry_the_import_pins_and_warns(
    bundles: SignedBundles, tmp_path: Path
) -> None:
    with runtime(tmp_path, bundles, registries_d={}) as crio:
        agent = agent_for(tmp_path, crio, bundles)
        code, report = imported(agent, bundles.signed)
        assert code == 0, report
        assert await present(crio, bundles.refs) == bundles.refs
        reasons = [warning["reason"] for warning in report["warnings"]]
        assert reasons == ["SigstoreAttachmentsOff"] * 2
        assert all("use-sigstore-attachments" in w["message"] for w in report["warnings"])


def is_back(status: dict[str, Any], count: int) -> bool:
    loss = status.get("imageLoss") or {}
    return (
        set_state(status, "line-3") == "Pinned"
        and loss.get("resolved") is True
        and loss.get("restoredFromStore") == count
    )


@pytest.mark.timeout(300)
async def test_signed_images_the_runtime_lost_come_back_from_the_store_with_their_signatures(
    bundles: SignedBundles, tmp_path: Path
) -> None:
    """After CRI-O lost its storage, the daemon restores the images from its store through the
    loopback mirror, serving the stored signature tags: the policy still holds, no registry."""
    scope = f"docker:\n  {bundles.registry_host}:\n    use-sigstore-attachments: true\n"
    with runtime(tmp_path, bundles, registries_d={"test-registry.yaml": scope}) as crio:
        agent = agent_for(tmp_path, crio, bundles)
        code, report = imported(agent, bundles.signed)
        assert code == 0, report.get("message")
        with agent:
            agent.wait_status(lambda s: set_state(s, "line-3") == "Pinned", what="set pinned")
            crio.kill()
            shutil.rmtree(crio.storage_root)
            crio.start()
            agent.wait_status(
                lambda s: is_back(s, len(bundles.refs)),
                what="the signed images back from the store",
                timeout_s=120,
            )
            assert await present(crio, bundles.refs) == bundles.refs
            assert "images_restored_from_store" in agent.current_run_log()
        assert sorted(p.name for p in crio.registries_d_dir.iterdir()) == ["test-registry.yaml"]
