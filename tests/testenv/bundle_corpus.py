"""A malicious-bundle corpus: one good signed bundle, and flaws made from copies of it.

``good_draft(platform)`` builds a small valid bundle in memory (a ``Draft``) from generated
images (``tests/testenv/images.py``): ``corpus/app`` for the node's platform, and
``corpus/multi``, an index of the node's platform and another, of which the bundle carries
the index and the node's child only. Both share a base layer; one PinnedImageSet names
both. ``CASES`` maps each flaw to a ``Case``: how to damage a copy of the draft, and the
reason code nodeagent must refuse it with. ``Draft.write`` lays the bundle out on disk and
signs ``bundle.json`` with the trusted key, so a flaw behind the signature is signed by a
trusted key; flaws of the signature itself choose another signing. Content flaws go
through ``Draft.replace_blob``/``drop_blob``, which keep everything else consistent
(descriptors, image names, ``index.json``, ``bundle.json``'s lists and sizes), so each case
breaks one rule only. ``stage`` says where the daemon's import finds the flaw: ``check``
before anything is pulled, ``serve`` only while the runtime pulls (a layer is hashed as it
is sent); ``bundle verify`` finds both.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nodeagent.bundles import minisign
from nodeagent.registries import Platform
from tests.testenv.images import (
    MEDIA_TYPE_INDEX,
    BuiltImage,
    LayerSpec,
    TestImage,
    build_index,
    canonical_json,
)

HOST = "127.0.0.1:39"
"""The images' registry: nothing listens there, so only the bundle can provide them."""
SET_NAME = "corpus-apps"
BUNDLE_ID = "corpus-good"
OCI_LAYOUT_BYTES = b'{"imageLayoutVersion":"1.0.0"}'
REF_NAME = "org.opencontainers.image.ref.name"
SIGNATURE = "bundle.json.minisig"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024

Signing = Literal["trusted", "stranger", "legacy", "none"]
Stage = Literal["check", "serve"]


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blob_path(digest: str) -> str:
    return "blobs/sha256/" + digest.removeprefix("sha256:")


# ---------------------------------------------------------------- keys and signatures
@dataclass(frozen=True)
class CorpusKeys:
    trusted: minisign.SecretKey
    trusted_public: str
    stranger: minisign.SecretKey

    def install(self, directory: Path) -> Path:
        """The trusted key as ``directory/corpus.pub``; return the directory."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "corpus.pub").write_text(self.trusted_public)
        return directory


def make_keys() -> CorpusKeys:
    public, secret = minisign.generate_keypair(comment="corpus trusted")
    _, stranger = minisign.generate_keypair(comment="corpus stranger")
    return CorpusKeys(
        minisign.parse_secret_key(secret), public, minisign.parse_secret_key(stranger)
    )


def legacy_signature(data: bytes, key: minisign.SecretKey, comment: str) -> bytes:
    """A legacy ("Ed") minisign signature: of the message itself, not of its BLAKE2b hash."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
    )

    signer = Ed25519PrivateKey.from_private_bytes(key.seed)
    signature = signer.sign(data)
    comment_signature = signer.sign(signature + comment.encode())
    lines = [
        "untrusted comment: legacy signature",
        base64.b64encode(b"Ed" + key.key_id + signature).decode(),
        f"trusted comment: {comment}",
        base64.b64encode(comment_signature).decode(),
    ]
    return "".join(f"{line}\n" for line in lines).encode()


def sign(data: bytes, keys: CorpusKeys, signing: Signing) -> bytes | None:
    comment = "corpus bundle"
    if signing == "none":
        return None
    if signing == "legacy":
        return legacy_signature(data, keys.trusted, comment)
    key = keys.trusted if signing == "trusted" else keys.stranger
    return minisign.sign(data, key, trusted_comment=comment).encode()


# ---------------------------------------------------------------- the draft
def _redescribe(body: bytes, old: str, new: str, size: int) -> bytes:
    """``body`` (JSON) with every descriptor of ``old`` pointing at ``new`` of ``size``."""

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("digest") == old:
                value["digest"], value["size"] = new, size
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    doc = json.loads(body)
    walk(doc)
    return canonical_json(doc)


@dataclass
class Draft:
    """A bundle before it is written: its files, ``bundle.json``'s document, how it is signed."""

    platform: Platform
    files: dict[str, bytes]
    doc: dict[str, Any]
    parts: dict[str, str]
    """Digest of each part by role: app_manifest, app_config, app_layer, base_layer,
    multi_index, multi_child, multi_config, multi_layer (before any change)."""
    spare: dict[str, bytes] = field(default_factory=dict)
    """Blobs the bundle does not carry: ``other_child``, the index's other platform."""
    manifest_bytes: bytes | None = None
    """``bundle.json`` exactly, instead of ``doc`` serialized."""
    signing: Signing = "trusted"
    signature: bytes | None = None
    """The signature file exactly, instead of one made by ``signing``."""
    on_disk: list[Callable[[Path], None]] = field(default_factory=list)
    """Changes made to the written tree, after signing."""

    def copy(self) -> Draft:
        return copy.deepcopy(self)

    def bundle_json(self) -> bytes:
        if self.manifest_bytes is not None:
            return self.manifest_bytes
        return json.dumps(self.doc, indent=1).encode() + b"\n"

    def write(self, root: Path, keys: CorpusKeys) -> Path:
        root.mkdir(parents=True)
        for path, data in sorted(self.files.items()):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)
        data = self.bundle_json()
        (root / "bundle.json").write_bytes(data)
        signature = self.signature if self.signature is not None else sign(data, keys, self.signing)
        if signature is not None:
            (root / SIGNATURE).write_bytes(signature)
        for change in self.on_disk:
            change(root)
        return root

    # -------------------------------------------------------------- edits that stay consistent
    def blob(self, digest: str) -> bytes | None:
        return self.files.get(blob_path(digest))

    def json_of(self, digest: str) -> Any:
        data = self.blob(digest)
        assert data is not None, digest
        return json.loads(data)

    def replace_blob(self, old: str, data: bytes) -> str:
        """Put ``data`` in place of blob ``old``; parents, names and lists follow. Its digest."""
        new = _sha(data)
        self.files.pop(blob_path(old))
        self.files[blob_path(new)] = data
        for path in list(self.files):
            body = self.files.get(path)
            if path == blob_path(new) or body is None or old.encode() not in body:
                continue
            updated = _redescribe(body, old, new, len(data))
            if path.startswith("blobs/"):
                self.replace_blob("sha256:" + path.rsplit("/", 1)[1], updated)
            else:
                self.files[path] = updated
        self.doc = json.loads(json.dumps(self.doc).replace(old, new))
        self.relist()
        return new

    def replace_json(self, old: str, change: Callable[[Any], Any]) -> str:
        doc = self.json_of(old)
        return self.replace_blob(old, canonical_json(change(doc) or doc))

    def drop_blob(self, digest: str) -> None:
        """Remove a blob from the tree and from ``bundle.json`` (neither there nor listed)."""
        self.files.pop(blob_path(digest))
        self.relist()

    def set_file(self, path: str, data: bytes | None) -> None:
        """Put ``data`` at ``path`` (None: remove it) and list the files anew."""
        if data is None:
            self.files.pop(path)
        else:
            self.files[path] = data
        self.relist()

    def relist(self) -> None:
        """``bundle.json``'s blobs, files and image sizes from the files as they are now."""
        blobs = {p: d for p, d in self.files.items() if p.startswith("blobs/sha256/")}
        self.doc["blobs"] = [
            {"digest": "sha256:" + p.rsplit("/", 1)[1], "sizeBytes": len(d)}
            for p, d in sorted(blobs.items())
        ]
        self.doc["files"] = [
            {"path": p, "sha256": _sha(d).removeprefix("sha256:"), "sizeBytes": len(d)}
            for p, d in sorted(self.files.items())
            if p not in blobs
        ]
        for image in self.doc["images"]:
            image["sizeBytes"] = sum(self._closure(image["manifestDigest"]).values())

    def _closure(self, digest: str) -> dict[str, int]:
        """Digest → size of each blob the image needs that the draft holds."""
        body = self.blob(digest)
        if body is None:
            return {}
        used = {digest: len(body)}
        try:
            doc = json.loads(body)
            if "manifests" in doc:
                child = next(m for m in doc["manifests"] if self._is_mine(m))
                body = self.blob(child["digest"])
                if body is None:
                    return used
                used[child["digest"]] = len(body)
                doc = json.loads(body)
            for item in [doc["config"], *doc["layers"]]:
                data = self.blob(item["digest"])
                if data is not None:
                    used[item["digest"]] = len(data)
        except (ValueError, KeyError, TypeError, AttributeError, StopIteration, RecursionError):
            pass
        return used

    def _is_mine(self, entry: dict[str, Any]) -> bool:
        found = entry.get("platform", {})
        return (found.get("os"), found.get("architecture")) == (
            self.platform.os,
            self.platform.architecture,
        )


def _blob_bytes(image: BuiltImage) -> list[tuple[str, bytes]]:
    out = []
    for blob in [image.manifest, *image.blobs()]:
        with blob.open() as stream:
            out.append((blob.digest, stream.read()))
    return out


def other_architecture(platform: Platform) -> str:
    return "arm64" if platform.architecture != "arm64" else "amd64"


def good_draft(platform: Platform) -> Draft:
    """The good bundle the corpus starts from (a few tens of KiB)."""
    variant = platform.variant or None
    base = LayerSpec(16 * 1024, seed=4101)
    app = TestImage(
        "corpus/app", [base, LayerSpec(8 * 1024, 4102)], platform.architecture, variant=variant
    ).build()
    mine = TestImage(
        "corpus/multi", [base, LayerSpec(8 * 1024, 4103)], platform.architecture, variant=variant
    ).build()
    theirs = TestImage(
        "corpus/multi", [LayerSpec(8 * 1024, 4104)], other_architecture(platform)
    ).build()
    multi = build_index([mine, theirs])
    files = {blob_path(d): data for d, data in [*_blob_bytes(app), *_blob_bytes(mine)]}
    files[blob_path(multi.digest)] = multi.manifest.data or b""
    refs = {
        "app": f"{HOST}/{app.repository}@{app.digest}",
        "multi": f"{HOST}/{multi.repository}@{multi.digest}",
    }
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_INDEX,
        "manifests": [
            {**app.manifest.descriptor(), "annotations": {REF_NAME: refs["app"]}},
            {**multi.manifest.descriptor(), "annotations": {REF_NAME: refs["multi"]}},
        ],
    }
    files["oci-layout"] = OCI_LAYOUT_BYTES
    files["index.json"] = json.dumps(index, indent=2).encode()
    set_object = {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "PinnedImageSet",
        "metadata": {"name": SET_NAME},
        "spec": {"pinnedImages": [{"name": refs["app"]}, {"name": refs["multi"]}]},
    }
    doc = {
        "formatVersion": 1,
        "bundleId": BUNDLE_ID,
        "created": "2026-11-22T09:30:00Z",
        "architecture": platform.architecture,
        "layout": "oci",
        "images": [
            {"name": refs[role], "manifestDigest": refs[role].rsplit("@", 1)[1], "sizeBytes": 0}
            for role in ("app", "multi")
        ],
        "blobs": [],
        "files": [],
        "pinnedImageSets": [{"persistent": True, "object": set_object}],
    }
    parts = {
        "app_manifest": app.digest,
        "app_config": app.config.digest,
        "app_layer": app.layers[1].digest,
        "base_layer": app.layers[0].digest,
        "multi_index": multi.digest,
        "multi_child": mine.digest,
        "multi_config": mine.config.digest,
        "multi_layer": mine.layers[1].digest,
    }
    draft = Draft(platform, files, doc, parts, spare={"other_child": theirs.manifest.data or b""})
    draft.relist()
    return draft


# ---------------------------------------------------------------- on-disk changes
def flip_byte(path: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        data = bytearray((root / path).read_bytes())
        data[len(data) // 2] ^= 0x01
        (root / path).write_bytes(bytes(data))

    return change


def add_file(path: str, data: bytes = b"x") -> Callable[[Path], None]:
    def change(root: Path) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)

    return change


def add_dir(path: str) -> Callable[[Path], None]:
    return lambda root: (root / path).mkdir(parents=True)


def link_out(path: str) -> Callable[[Path], None]:
    """Move ``path`` out of the bundle and leave a symlink to it (same bytes) in its place."""

    def change(root: Path) -> None:
        outside = root.parent / f"outside-{path.replace('/', '_')}"
        (root / path).rename(outside)
        (root / path).symlink_to(outside)

    return change


def resize(path: str, delta: int) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        size = (root / path).stat().st_size
        os.truncate(root / path, size + delta)

    return change


def edit_text(path: str, old: str, new: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        text = (root / path).read_text()
        assert old in text, (path, old)
        (root / path).write_text(text.replace(old, new, 1))

    return change


def mknod(path: str) -> Callable[[Path], None]:
    return lambda root: os.mknod(root / path, stat.S_IFCHR | 0o600, os.makedev(1, 3))


def mkfifo(path: str) -> Callable[[Path], None]:
    return lambda root: os.mkfifo(root / path)
