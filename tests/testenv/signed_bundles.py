"""Signed OCI-layout bundles of generated images, made in-process (no registry, no CLI)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.bundles import ecdsa_signature, minisign
from nodeagent.bundles.manifest import BundleManifest, parse_manifest
from nodeagent.bundles.signatures import signature_tag
from nodeagent.specs import API_VERSION, KIND
from tests.testenv.images import BuiltImage, LayerSpec, TestImage
from tests.testenv.oci_layout import write_oci_layout
from tests.testenv.sigstore import SigningKey, signature_manifest

HOST = "registry.example:5000"


@dataclass(frozen=True)
class Keys:
    trusted_dir: Path
    secret: minisign.SecretKey
    key_id_hex: str

    @classmethod
    def make(cls, directory: Path) -> Keys:
        public, secret = minisign.generate_keypair(comment="store tests")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "factory.pub").write_text(public)
        key = minisign.parse_secret_key(secret)
        return cls(directory, key, key.public_key().key_id_hex)


@dataclass(frozen=True)
class Signed:
    root: Path
    manifest: BundleManifest
    images: tuple[BuiltImage, ...]

    def blob_file(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest.removeprefix("sha256:")


@dataclass(frozen=True)
class EcdsaKeys:
    """An ECDSA signing key (PEM PKCS#8) and its public key (PEM SubjectPublicKeyInfo), as a
    FIPS site's factory holds them (decision 0075)."""

    private_pem: bytes
    public_pem: bytes

    @classmethod
    def make(cls, curve: str = "secp256r1") -> EcdsaKeys:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.generate_private_key(ec.SECP384R1() if curve == "secp384r1" else ec.SECP256R1())
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return cls(private, public)

    def install(self, trusted_dir: Path, name: str = "factory-fips") -> None:
        trusted_dir.mkdir(parents=True, exist_ok=True)
        (trusted_dir / f"{name}.pem").write_bytes(self.public_pem)


def with_ecdsa(signed: Signed, keys: EcdsaKeys, *, keep_minisign: bool = True) -> Signed:
    """``signed`` carrying ``bundle.json.ecdsa-sig`` over the same bytes and trusted comment
    as its minisign signature; without ``keep_minisign``, that one removed (ECDSA only)."""
    data = (signed.root / "bundle.json").read_bytes()
    text = ecdsa_signature.sign(data, keys.private_pem, trusted_comment="t")
    (signed.root / "bundle.json.ecdsa-sig").write_text(text)
    if not keep_minisign:
        (signed.root / "bundle.json.minisig").unlink()
    return signed


def image(name: str, sizes: Sequence[tuple[int, int]], cache: Path) -> BuiltImage:
    """An image of layers ``(size, seed)``: equal pairs make equal (shared) layers."""
    return TestImage(name, [LayerSpec(size, seed) for size, seed in sizes]).build(cache)


def signed_bundle(
    root: Path,
    keys: Keys,
    images: Sequence[BuiltImage],
    *,
    bundle_id: str,
    set_name: str,
    created: str = "2026-01-01T00:00:00Z",
    channel: str | None = None,
    host: str = HOST,
    sequence: int | None = None,
    expires: str | None = None,
    supersedes: Sequence[str] = (),
) -> Signed:
    """An OCI-layout bundle of ``images`` (named ``host/<repository>@<digest>``) carrying
    one set of them, signed by ``keys``; with a ``sequence`` (and perhaps ``expires`` and the
    key ids ``keys`` ``supersedes``), of format 3."""
    layout = write_oci_layout(root, host, images, bundle_id=bundle_id)
    doc = json.loads((root / "bundle.json").read_text())
    refs = [{"name": layout.ref(i)} for i in images]
    spec = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": set_name},
        "spec": {"pinnedImages": refs},
    }
    doc |= {"created": created, "pinnedImageSets": [{"persistent": True, "object": spec}]}
    if channel is not None:
        doc["channel"] = channel
    if sequence is not None:
        doc |= {"formatVersion": 3, "sequence": sequence}
    if expires is not None:
        doc["expires"] = expires
    if supersedes:
        doc["supersedes"] = list(supersedes)
    data = json.dumps(doc, indent=1).encode()
    (root / "bundle.json").write_bytes(data)
    (root / "bundle.json.minisig").write_text(minisign.sign(data, keys.secret, trusted_comment="t"))
    return Signed(root, parse_manifest(data), tuple(images))


def with_sigstore(signed: Signed, keys: Keys, key: SigningKey, host: str = HOST) -> Signed:
    """``signed`` carrying each image's sigstore signature made with ``key`` (format 3,
    ``imageSignatures``), as ``bundle create --with-signatures`` makes it; signed again."""
    root = signed.root
    doc: dict[str, Any] = json.loads((root / "bundle.json").read_text())
    entries = []
    for built in signed.images:
        manifest, blobs = signature_manifest(key, f"{host}/{built.repository}", built.digest)
        for data in (manifest, *blobs):
            digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
            (root / "blobs" / "sha256" / digest.removeprefix("sha256:")).write_bytes(data)
            doc["blobs"].append({"digest": digest, "sizeBytes": len(data)})
        entries.append({
            "image": f"{host}/{built.repository}@{built.digest}",
            "tag": signature_tag(built.digest),
            "manifest": f"sha256:{hashlib.sha256(manifest).hexdigest()}",
        })  # fmt: skip
    doc |= {"formatVersion": 3, "sequence": doc.get("sequence", 1), "imageSignatures": entries}
    data = json.dumps(doc, indent=1).encode()
    (root / "bundle.json").write_bytes(data)
    (root / "bundle.json.minisig").write_text(minisign.sign(data, keys.secret, trusted_comment="t"))
    return Signed(root, parse_manifest(data), signed.images)


def with_served_tags(signed: Signed, keys: Keys, tags: dict[str, str]) -> Signed:
    """``signed`` serving ``tags`` (``host/repository:tag`` → digest; format 3,
    ``servedTags``), as ``bundle create --serve-tags`` makes it; signed again."""
    root = signed.root
    doc: dict[str, Any] = json.loads((root / "bundle.json").read_text())
    doc |= {"formatVersion": 3, "sequence": doc.get("sequence", 1), "servedTags": tags}
    data = json.dumps(doc, indent=1).encode()
    (root / "bundle.json").write_bytes(data)
    (root / "bundle.json.minisig").write_text(minisign.sign(data, keys.secret, trusted_comment="t"))
    return Signed(root, parse_manifest(data), signed.images)


def with_release(
    signed: Signed,
    keys: Keys,
    signatures: Sequence[bytes],
    *,
    version: str = "4.99.1",
    previous: Sequence[str] = (),
) -> Signed:
    """``signed`` as a release bundle (format 3, ``release``): its first image the release
    image, its set the release set, ``signatures`` carried as the release's signature files
    (``release-signatures/sha256-<hex>-<n>``, listed in ``files[]``), ``previous`` the
    versions it upgrades from (left out when empty); signed again."""
    root = signed.root
    doc: dict[str, Any] = json.loads((root / "bundle.json").read_text())
    release_image = doc["images"][0]["name"]
    digest = release_image.rpartition("@")[2]
    entries = []
    for index, data in enumerate(signatures, start=1):
        path = f"release-signatures/{digest.replace(':', '-')}-{index}"
        (root / path).parent.mkdir(exist_ok=True)
        (root / path).write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        doc["files"].append({"path": path, "sizeBytes": len(data), "sha256": sha})
        entries.append({"digest": digest, "index": index, "path": path,
                        "sizeBytes": len(data), "sha256": sha})  # fmt: skip
    set_name = doc["pinnedImageSets"][0]["object"]["metadata"]["name"]
    release = {"image": release_image, "version": version, "set": set_name, "signatures": entries}
    if previous:
        release["previous"] = list(previous)
    doc |= {"formatVersion": 3, "sequence": doc.get("sequence", 1), "release": release}
    data = json.dumps(doc, indent=1).encode()
    (root / "bundle.json").write_bytes(data)
    (root / "bundle.json.minisig").write_text(minisign.sign(data, keys.secret, trusted_comment="t"))
    return Signed(root, parse_manifest(data), signed.images)
