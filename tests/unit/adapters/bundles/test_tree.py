"""The bundle verifier on hand-made bundles in tmp_path: keys, safe opening, walk, hashing."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodeagent.adapters.bundles.tree import (
    BundleDir,
    HashingReader,
    TrustedKeys,
    check_contents,
    check_signed_bundle,
    hash_files,
    load_trusted_keys_dir,
    read_signed_manifest,
    verify_bundle,
    walk_tree,
)
from nodeagent.bundles import manifest as bundle
from nodeagent.bundles import minisign, tree_rules
from nodeagent.bundles.manifest import (
    BundleDigestMismatch,
    BundleIncomplete,
    BundleManifestInvalid,
    BundleSizeMismatch,
    BundleUnlistedFile,
    BundleUnsafeEntry,
    ExpectedFile,
)
from nodeagent.bundles.tree_rules import TreeEntry
from nodeagent.errors import (
    BundleArchitectureMismatch,
    KeyMalformed,
    SignatureInvalid,
    SignatureLegacy,
    SignatureMalformed,
    SignatureMissing,
    UnknownSigningKey,
)
from nodeagent.registries import Platform

LAYER = b"layer bytes " * 100_000  # 1.2 MB: two read chunks


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Keys:
    def __init__(self, directory: Path) -> None:
        public_text, secret_text = minisign.generate_keypair()
        self.secret = minisign.parse_secret_key(secret_text)
        self.public = minisign.parse_public_key(public_text)
        self.dir = directory
        directory.mkdir()
        (directory / "factory.pub").write_text(public_text)

    def trusted(self) -> TrustedKeys:
        return load_trusted_keys_dir(self.dir, fips_switch=self.dir / "no-fips-switch")


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path / "trusted")


CONFIG = json.dumps({"os": "linux", "architecture": "amd64"}).encode()
MANIFEST = json.dumps(
    {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": f"sha256:{hashlib.sha256(CONFIG).hexdigest()}",
            "size": len(CONFIG),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": f"sha256:{hashlib.sha256(LAYER).hexdigest()}",
                "size": len(LAYER),
            }
        ],
    }
).encode()
IMAGE = f"quay.io/acme/app@sha256:{hashlib.sha256(MANIFEST).hexdigest()}"
AMD64 = Platform("linux", "amd64")


def _index() -> bytes:
    entry: dict[str, str | int] = {"mediaType": "application/vnd.oci.image.manifest.v1+json"}
    entry |= {"digest": f"sha256:{_sha(MANIFEST)}", "size": len(MANIFEST)}
    return json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode()


def _layout_file(root: Path, name: str, data: bytes) -> dict[str, str | int]:
    (root / name).write_bytes(data)
    return {"path": name, "sha256": _sha(data), "sizeBytes": len(data)}


def _write_bundle(root: Path, keys: Keys, **changes: object) -> bytes:
    """A small valid bundle: an image (manifest, config, one layer), oci-layout, index.json."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for blob in (MANIFEST, CONFIG, LAYER):
        (blobs / _sha(blob)).write_bytes(blob)
    files = [
        _layout_file(root, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
        _layout_file(root, "index.json", _index()),
    ]
    size = len(MANIFEST) + len(CONFIG) + len(LAYER)
    doc = {
        "formatVersion": 1,
        "bundleId": "unit",
        "created": "2026-01-01T00:00:00Z",
        "architecture": "amd64",
        "images": [
            {"name": IMAGE, "manifestDigest": f"sha256:{_sha(MANIFEST)}", "sizeBytes": size}
        ],
        "blobs": [
            {"digest": f"sha256:{_sha(blob)}", "sizeBytes": len(blob)}
            for blob in (MANIFEST, CONFIG, LAYER)
        ],
        "files": files,
        "pinnedImageSets": [],
        **changes,
    }
    data = json.dumps(doc).encode()
    (root / "bundle.json").write_bytes(data)
    signature = minisign.sign(data, keys.secret, trusted_comment="unit bundle")
    (root / "bundle.json.minisig").write_text(signature)
    return data


@pytest.fixture
def root(tmp_path: Path, keys: Keys) -> Path:
    path = tmp_path / "bundle"
    path.mkdir()
    _write_bundle(path, keys)
    return path


def _layer_path(root: Path) -> Path:
    return root / "blobs" / "sha256" / _sha(LAYER)


# ---------------------------------------------------------------- trusted keys


def test_trusted_keys_are_named_by_file_stem(keys: Keys) -> None:
    (keys.dir / "notes.txt").write_text("not a key")
    trusted = keys.trusted().minisign
    assert list(trusted) == [keys.public.key_id]
    assert trusted[keys.public.key_id].name == "factory"


def test_missing_key_directory_trusts_nothing(tmp_path: Path) -> None:
    assert len(load_trusted_keys_dir(tmp_path / "absent")) == 0


def test_the_same_key_twice_is_an_error(keys: Keys) -> None:
    (keys.dir / "copy.pub").write_text((keys.dir / "factory.pub").read_text())
    with pytest.raises(KeyMalformed, match="same key id"):
        keys.trusted()


# ---------------------------------------------------------------- the signed manifest


def test_signed_manifest_reads_and_names_the_key(root: Path, keys: Keys) -> None:
    manifest, verified = read_signed_manifest(root, keys.trusted())
    assert manifest.bundle_id == "unit"
    assert (verified.key_name, verified.trusted_comment) == ("factory", "unit bundle")


def test_R4_no_trusted_keys_names_the_signing_key(root: Path, keys: Keys) -> None:
    with pytest.raises(UnknownSigningKey, match=keys.public.key_id_hex):
        read_signed_manifest(root, TrustedKeys())


def test_R5_signature_is_checked_before_parsing(root: Path, keys: Keys) -> None:
    (root / "bundle.json").write_bytes(b"not json at all")
    with pytest.raises(SignatureInvalid):
        read_signed_manifest(root, keys.trusted())


def test_R2_missing_signature_and_manifest(root: Path, keys: Keys) -> None:
    (root / "bundle.json.minisig").unlink()
    with pytest.raises(SignatureMissing):
        read_signed_manifest(root, keys.trusted())
    (root / "bundle.json").unlink()
    with pytest.raises(BundleIncomplete, match=r"holds no bundle\.json"):
        read_signed_manifest(root, keys.trusted())


def test_R1_oversized_manifest_and_signature_are_refused(root: Path, keys: Keys) -> None:
    big = root / "bundle.json.minisig"
    with big.open("r+b") as stream:
        stream.truncate(64 * 1024)
    with pytest.raises(SignatureMalformed, match="larger than"):
        read_signed_manifest(root, keys.trusted())
    with (root / "bundle.json").open("r+b") as stream:
        stream.truncate(bundle.MAX_MANIFEST_BYTES + 1)  # sparse: no 16 MiB written
    with pytest.raises(BundleManifestInvalid, match="larger than"):
        read_signed_manifest(root, keys.trusted())


@pytest.mark.parametrize("name", ["bundle.json", "bundle.json.minisig"])
def test_R1_manifest_or_signature_as_symlink_or_fifo(root: Path, keys: Keys, name: str) -> None:
    (root / name).rename(root.parent / name)
    (root / name).symlink_to(root.parent / name)
    with pytest.raises(BundleUnsafeEntry):
        read_signed_manifest(root, keys.trusted())
    (root / name).unlink()
    os.mkfifo(root / name)  # opening must not block
    with pytest.raises(BundleUnsafeEntry, match="not a regular file"):
        read_signed_manifest(root, keys.trusted())


def test_R3_legacy_signature_is_refused_for_bundles(root: Path, keys: Keys) -> None:
    data = (root / "bundle.json").read_bytes()
    signer = Ed25519PrivateKey.from_private_bytes(keys.secret.seed)
    legacy = signer.sign(data)
    lines = [
        "untrusted comment: legacy",
        base64.b64encode(b"Ed" + keys.secret.key_id + legacy).decode(),
        "trusted comment: legacy",
        base64.b64encode(signer.sign(legacy + b"legacy")).decode(),
    ]
    (root / "bundle.json.minisig").write_text("\n".join(lines) + "\n")
    verified = minisign.verify(
        data, (root / "bundle.json.minisig").read_text(), keys.trusted().minisign
    )
    assert not verified.is_prehashed  # a good signature, of the kind minisign -l makes
    with pytest.raises(SignatureLegacy, match="prehashed"):
        read_signed_manifest(root, keys.trusted())


def test_R25_contents_are_read_checked_against_their_digests(root: Path, keys: Keys) -> None:
    manifest, _ = read_signed_manifest(root, keys.trusted())
    check_contents(root, manifest, AMD64)
    config = root / "blobs" / "sha256" / _sha(CONFIG)
    config.write_bytes(CONFIG.replace(b"amd64", b"AMD64"))
    with pytest.raises(BundleDigestMismatch):
        check_contents(root, manifest, AMD64)


def test_R13_signed_bundle_checks_architecture_tree_and_contents(root: Path, keys: Keys) -> None:
    manifest, _ = read_signed_manifest(root, keys.trusted())
    check_signed_bundle(root, manifest, AMD64)
    with pytest.raises(BundleArchitectureMismatch, match="this node is linux/arm64"):
        check_signed_bundle(root, manifest, Platform("linux", "arm64"))


# ---------------------------------------------------------------- the tree


def test_walk_sees_every_kind_without_following_links(tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f").write_bytes(b"123")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    os.mkfifo(tmp_path / "pipe")
    entries = sorted(walk_tree(tmp_path), key=lambda e: e.path)
    assert entries == [
        TreeEntry("d", "dir"),
        TreeEntry("d/e", "dir"),
        TreeEntry("d/e/f", "file", 3),
        TreeEntry("link", "symlink"),
        TreeEntry("pipe", "other"),
    ]


def test_R17_walk_is_lazy_and_never_enters_an_unlisted_directory(root: Path, keys: Keys) -> None:
    junk = root / "junk"
    junk.mkdir()
    for n in range(200):
        (junk / str(n)).write_bytes(b"")
    manifest, _ = read_signed_manifest(root, keys.trusted())
    walked: list[str] = []

    def counted() -> Iterator[TreeEntry]:
        for entry in walk_tree(root):
            walked.append(entry.path)
            yield entry

    with pytest.raises(BundleUnlistedFile, match="directory junk"):
        tree_rules.check_tree(counted(), manifest)
    assert not any(path.startswith("junk/") for path in walked)
    assert len(walked) <= 5  # the root's entries at most


def test_walk_of_a_good_bundle_passes_the_tree_rules(root: Path, keys: Keys) -> None:
    manifest, _ = read_signed_manifest(root, keys.trusted())
    tree_rules.check_tree(walk_tree(root), manifest)


# ---------------------------------------------------------------- opening and hashing


def _expected(path: str, data: bytes) -> ExpectedFile:
    return ExpectedFile(path, len(data), _sha(data))


def test_open_refuses_a_link_anywhere_on_the_path(root: Path) -> None:
    expected = _expected(f"blobs/sha256/{_sha(LAYER)}", LAYER)
    with BundleDir(root) as directory, directory.open_file(expected) as stream:
        assert stream.read() == LAYER
    (root / "blobs").rename(root.parent / "real-blobs")
    (root / "blobs").symlink_to(root.parent / "real-blobs")
    with BundleDir(root) as directory, pytest.raises(BundleUnsafeEntry, match="symbolic link"):
        directory.open_file(expected)


def test_open_checks_presence_and_size(root: Path) -> None:
    with BundleDir(root) as directory:
        with pytest.raises(BundleIncomplete, match="missing"):
            directory.open_file(_expected("blobs/sha256/" + "0" * 64, b""))
        with pytest.raises(BundleSizeMismatch, match=r"bundle\.json says 3"):
            directory.open_file(_expected("oci-layout", b"123"))


def _read_all(reader: HashingReader) -> bytes:
    parts = []
    while chunk := reader.read(1000):
        parts.append(chunk)
    return b"".join(parts)


def test_hashing_reader_passes_the_bytes_and_checks_them() -> None:
    expected = _expected("x", LAYER)
    reader = HashingReader(io.BytesIO(LAYER), expected)
    assert _read_all(reader) == LAYER
    reader.finish()
    short = HashingReader(io.BytesIO(LAYER[:-1]), expected)
    _read_all(short)
    with pytest.raises(BundleSizeMismatch, match="read 1199999 bytes"):
        short.finish()
    flipped = HashingReader(io.BytesIO(b"L" + LAYER[1:]), expected)
    _read_all(flipped)
    with pytest.raises(BundleDigestMismatch, match="x does not match its digest"):
        flipped.finish()


def test_R25_hashing_refuses_more_bytes_than_listed_as_they_come() -> None:
    """A file that grows while hashed is refused at the first chunk past its size."""
    expected = _expected("x", LAYER[:1000])
    reader = HashingReader(io.BytesIO(LAYER), expected)
    with pytest.raises(BundleSizeMismatch, match="more than the 1000 bytes"):
        reader.read(64 * 1024)


def test_hash_files_reports_progress_to_the_total(root: Path, keys: Keys) -> None:
    manifest, _ = read_signed_manifest(root, keys.trusted())
    seen: list[tuple[int, int]] = []
    hash_files(root, manifest, lambda done, total: seen.append((done, total)))
    total = manifest.total_size_bytes
    assert seen[-1] == (total, total)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert len(seen) >= 3  # the layer alone takes two 1 MiB reads


# ---------------------------------------------------------------- verify_bundle


def _clock(*readings: float) -> Iterator[float]:
    return iter(readings)


def test_report_of_a_good_bundle(root: Path, keys: Keys) -> None:
    clock = _clock(10.0, 12.5)
    report = verify_bundle(root, keys.dir, clock=lambda: next(clock))
    assert report.is_ok and report.error is None
    doc = report.to_json()
    assert doc["ok"] is True and doc["seconds"] == 2.5
    assert doc["signedBy"] == {
        "keyId": keys.public.key_id_hex, "keyName": "factory", "signatures": ["minisign"]
    }  # fmt: skip
    assert doc["hashedBytes"] == doc["totalSizeBytes"] == report.hashed_bytes > len(LAYER)
    assert [i["name"] for i in doc["images"]] == [IMAGE]


def test_report_of_a_damaged_bundle_keeps_what_was_learned(root: Path, keys: Keys) -> None:
    data = bytearray(LAYER)
    data[-1] ^= 1
    _layer_path(root).write_bytes(bytes(data))
    report = verify_bundle(root, keys.dir)
    assert isinstance(report.error, BundleDigestMismatch)
    doc = report.to_json()
    assert doc["ok"] is False
    assert doc["bundleId"] == "unit"  # the signature was good: the manifest is known
    assert doc["error"]["reason"] == "BundleDigestMismatch"
    assert doc["error"]["exitCode"] == 65


def test_report_without_hashing_misses_damage_but_not_size(root: Path, keys: Keys) -> None:
    data = bytearray(LAYER)
    data[-1] ^= 1
    _layer_path(root).write_bytes(bytes(data))
    assert verify_bundle(root, keys.dir, is_full=False).is_ok
    _layer_path(root).write_bytes(LAYER[:-1])
    report = verify_bundle(root, keys.dir, is_full=False)
    assert isinstance(report.error, BundleSizeMismatch)
    assert report.hashed_bytes == 0


def test_report_when_the_key_is_unknown(root: Path, tmp_path: Path) -> None:
    report = verify_bundle(root, tmp_path / "no-keys")
    assert isinstance(report.error, UnknownSigningKey)
    assert report.manifest is None
    assert "bundleId" not in report.to_json()
