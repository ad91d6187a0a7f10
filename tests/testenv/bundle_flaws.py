"""The flaws of the malicious-bundle corpus, each with the reason code it must be refused with.

Every case starts from a copy of ``bundle_corpus.good_draft`` and breaks one rule of
docs/bundle-format.md. Unless the flaw is about the signature, ``bundle.json`` is signed
by a trusted key after the change: the signature does not save a bad bundle. The list,
grouped as here, is in docs/security.md ("Malicious bundles refused").
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.bundles import ecdsa_signature
from tests.testenv.bundle_corpus import (
    HOST,
    MAX_MANIFEST_BYTES,
    SIGNATURE,
    Draft,
    Signing,
    Stage,
    add_dir,
    add_file,
    blob_path,
    edit_text,
    flip_byte,
    link_out,
    mkfifo,
    mknod,
    other_architecture,
    resize,
)
from tests.testenv.images import MEDIA_TYPE_INDEX, canonical_json

Flaw = Callable[[Draft], None]
OnDisk = Callable[[Path], None]
ECDSA_SIGNATURE = "bundle.json.ecdsa-sig"


@dataclass(frozen=True)
class Case:
    name: str
    group: str
    flaw: Flaw
    reason: str
    stage: Stage = "check"


# ---------------------------------------------------------------- building blocks
def _put(target: Any, key: Any, value: Any) -> None:
    target[key] = value


def doc(change: Callable[[dict[str, Any]], object]) -> Flaw:
    """Change ``bundle.json``'s document (signed afterwards)."""
    return lambda d: _ignore(change(d.doc))


def field(path: str, value: Any) -> Flaw:
    """Set one field of ``bundle.json``: ``path`` as ``images.0.sizeBytes``."""

    def flaw(d: Draft) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        target: Any = d.doc
        for part in parents:
            target = target[part]
        target[last] = value

    return flaw


def the_set(path: str, value: Any) -> Flaw:
    return field(f"pinnedImageSets.0.object.{path}", value)


def raw(make: Callable[[bytes], bytes]) -> Flaw:
    """``bundle.json``'s bytes made from the good ones (signed afterwards)."""

    def flaw(d: Draft) -> None:
        d.manifest_bytes = make(d.bundle_json())

    return flaw


def on_disk(*changes: OnDisk) -> Flaw:
    """Change the written tree (after signing)."""
    return lambda d: d.on_disk.extend(changes)


def at(role: str, make: Callable[[str], OnDisk]) -> Flaw:
    """An on-disk change of the blob with role ``role`` (``Draft.parts``)."""
    return lambda d: d.on_disk.append(make(blob_path(d.parts[role])))


def signing(how: Signing) -> Flaw:
    def flaw(d: Draft) -> None:
        d.signing = how

    return flaw


def signature(data: bytes) -> Flaw:
    def flaw(d: Draft) -> None:
        d.signature = data

    return flaw


def _ignore(_: object) -> None:
    return None


def _replayed_signature(d: Draft) -> None:
    """A trusted signature of another bundle.json, which then replaces the signed one."""
    other = copy.deepcopy(d.doc)
    other["bundleId"] = "corpus-other"
    data = json.dumps(other, indent=1).encode()
    d.on_disk.append(lambda root: _ignore((root / "bundle.json").write_bytes(data)))


def drop(role: str) -> Flaw:
    return lambda d: d.drop_blob(d.parts[role])


def replace(role: str, data: bytes) -> Flaw:
    return lambda d: _ignore(d.replace_blob(d.parts[role], data))


def edit(role: str, change: Callable[[Any], object]) -> Flaw:
    return lambda d: _ignore(d.replace_json(d.parts[role], change))


def index_json(change: Callable[[dict[str, Any]], object]) -> Flaw:
    def flaw(d: Draft) -> None:
        index = json.loads(d.files["index.json"])
        change(index)
        d.set_file("index.json", canonical_json(index))

    return flaw


def _manifest_missing(d: Draft) -> None:
    """The app's manifest neither in the tree, nor listed, nor named by index.json."""
    app = d.parts["app_manifest"]
    index_json(lambda i: _put(i, "manifests", [m for m in i["manifests"] if m["digest"] != app]))(d)
    d.drop_blob(app)


def _index_without_my_platform(d: Draft) -> None:
    """The index names only the other platform's child (which the bundle carries instead)."""
    mine = d.parts["multi_child"]
    d.replace_json(
        d.parts["multi_index"],
        lambda i: _put(i, "manifests", [m for m in i["manifests"] if m["digest"] != mine]),
    )
    other = d.spare["other_child"]
    d.set_file(blob_path("sha256:" + hashlib.sha256(other).hexdigest()), other)


def _config_of_other_architecture(d: Draft) -> None:
    d.replace_json(d.parts["app_config"], lambda c: _put(c, "architecture", "s390x"))


def _remove(path: str) -> OnDisk:
    return lambda root: (root / path).unlink()


def _untrusted_ecdsa(root: Path) -> None:
    """A valid ECDSA signature of the bundle's own bundle.json by a key no node trusts,
    beside its good minisign one: both must verify (decision 0075)."""
    from tests.testenv.signed_bundles import EcdsaKeys

    data = (root / "bundle.json").read_bytes()
    text = ecdsa_signature.sign(data, EcdsaKeys.make().private_pem, trusted_comment="corpus")
    (root / ECDSA_SIGNATURE).write_text(text)


def _deep(data: bytes) -> bytes:
    return data.replace(b"{", b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b",", 1)


ESCAPES = "\x1b]0;owned\x07\x1b[2J"
OTHER_REF = f"{HOST}/corpus/x@sha256:{'1' * 64}"
TAG_REF = f"{HOST}/corpus/app:latest"
AT_BLOB_PLACE = {"path": "blobs/sha256/" + "0" * 64, "sha256": "0" * 64, "sizeBytes": 1}
NESTED_INDEX = canonical_json({"schemaVersion": 2, "mediaType": MEDIA_TYPE_INDEX, "manifests": []})
SCHEMA1 = "application/vnd.docker.distribution.manifest.v1+json"
UNLISTED_ENTRY = {"mediaType": MEDIA_TYPE_INDEX, "digest": "sha256:" + "2" * 64, "size": 10}


# ---------------------------------------------------------------- the corpus
# fmt: off
_TABLE: list[tuple[str, str, str, Flaw]] = [
    # group, flaw, reason code, how
    ("signature", "no signature", "BundleUnsigned", signing("none")),
    ("signature", "empty signature", "BundleUnsigned", signature(b"")),
    ("signature", "signed by a key that is not trusted", "BundleSignedByUnknownKey",
     signing("stranger")),
    ("signature", "bundle.json changed after signing", "BundleSignatureInvalid",
     on_disk(edit_text("bundle.json", '"corpus-good"', '"corpus-evil"'))),
    ("signature", "signature of another bundle.json", "BundleSignatureInvalid",
     _replayed_signature),
    ("signature", "trusted comment changed", "BundleSignatureInvalid",
     on_disk(edit_text(SIGNATURE, "trusted comment: corpus", "trusted comment: evil"))),
    ("signature", "legacy (non-prehashed) signature by a trusted key", "BundleSignatureLegacy",
     signing("legacy")),
    ("signature", "signature that is not minisign", "BundleSignatureMalformed",
     signature(b"hello\n")),
    ("signature", "signature file over 16 KiB", "BundleSignatureMalformed",
     on_disk(resize(SIGNATURE, 17 << 10))),
    ("signature", "signature is a symbolic link", "BundleUnsafeEntry",
     on_disk(link_out(SIGNATURE))),
    ("signature", "an ECDSA signature file over 1 KiB beside a good minisign one",
     "BundleSignatureMalformed",
     on_disk(lambda root: _ignore((root / ECDSA_SIGNATURE).write_bytes(b"A" * 2048)))),
    ("signature", "an ECDSA signature by a key that is not trusted beside a good minisign one",
     "BundleSignedByUnknownKey", on_disk(_untrusted_ecdsa)),
    ("signature", "bundle.json missing", "BundleIncomplete", on_disk(_remove("bundle.json"))),
    ("signature", "bundle.json over 16 MiB", "BundleManifestInvalid",
     on_disk(resize("bundle.json", MAX_MANIFEST_BYTES))),

    ("bundle.json", "not JSON", "BundleManifestInvalid", raw(lambda b: b[: len(b) // 2])),
    ("bundle.json", "NaN as a size", "BundleManifestInvalid",
     field("images.0.sizeBytes", float("nan"))),
    ("bundle.json", "duplicate keys", "BundleManifestInvalid",
     raw(lambda b: b.replace(b"{", b'{"bundleId": "corpus-evil", ', 1))),
    ("bundle.json", "UTF-16", "BundleManifestInvalid", raw(lambda b: b.decode().encode("utf-16"))),
    ("bundle.json", "formatVersion true", "BundleManifestInvalid", field("formatVersion", True)),
    ("bundle.json", "formatVersion as a string", "BundleManifestInvalid",
     field("formatVersion", "1")),
    ("bundle.json", "formatVersion 4", "BundleFormatUnsupported", field("formatVersion", 4)),
    ("bundle.json", "image signatures in a format 2 bundle", "BundleManifestInvalid",
     doc(lambda m: m.update(formatVersion=2, imageSignatures=[]))),
    ("bundle.json", "an image signature under another image's tag", "BundleManifestInvalid",
     doc(lambda m: m.update(formatVersion=3, sequence=m.get("sequence", 1), imageSignatures=[{
         "image": m["images"][0]["name"], "tag": f"sha256-{'0' * 64}.sig",
         "manifest": m["blobs"][0]["digest"]}]))),
    ("bundle.json", "an image signature whose manifest is not a listed blob",
     "BundleManifestInvalid",
     doc(lambda m: m.update(formatVersion=3, sequence=m.get("sequence", 1), imageSignatures=[{
         "image": m["images"][0]["name"],
         "tag": m["images"][0]["manifestDigest"].replace(":", "-") + ".sig",
         "manifest": f"sha256:{'0' * 64}"}]))),
    ("bundle.json", "a target in a format 1 bundle", "BundleManifestInvalid",
     field("target", {"nodeSelector": "site=line-3"})),
    ("bundle.json", "a target with a key this reader does not know", "BundleManifestInvalid",
     doc(lambda m: m.update(formatVersion=2, target={"nodeSelector": "a", "nodes": ["x"]}))),
    ("bundle.json", "a target selector of 5,000 characters", "BundleManifestInvalid",
     doc(lambda m: m.update(formatVersion=2, target={"nodeSelector": "a=" + "b," * 2500}))),
    ("bundle.json", "a sequence in a format 1 bundle", "BundleManifestInvalid",
     field("sequence", 1 << 40)),
    ("bundle.json", "a sequence past 2^53-1", "BundleManifestInvalid",
     doc(lambda m: m.update(formatVersion=3, sequence=1 << 53))),
    ("bundle.json", "an expiry that names no real time", "BundleManifestInvalid",
     doc(lambda m: m.update(formatVersion=3, sequence=1, expires="2027-02-30T00:00:00Z"))),
    ("bundle.json", "nested 100,000 deep", "BundleManifestInvalid", raw(_deep)),
    ("bundle.json", "16 MiB of empty arrays", "BundleManifestInvalid",
     raw(lambda b: b.replace(b"{", b'{"x": [' + b"[]," * (5 << 20) + b"[]],", 1))),
    ("bundle.json", "a 4301-digit number", "BundleManifestInvalid",
     raw(lambda b: b.replace(b'"formatVersion": 1', b'"formatVersion": ' + b"9" * 4301))),
    ("bundle.json", "escaped lone surrogate", "BundleManifestInvalid",
     field("bundleId", "corpus\ud800")),
    ("bundle.json", "10 MB bundleId", "BundleManifestInvalid", field("bundleId", "a" * 10**7)),
    ("bundle.json", "bundleId with a path", "BundleManifestInvalid", field("bundleId", "../etc")),
    ("bundle.json", "created holding terminal escape sequences", "BundleManifestInvalid",
     field("created", ESCAPES + "2026-11-22T09:30:00Z")),
    ("bundle.json", "unknown layout", "BundleManifestInvalid", field("layout", "tar")),
    ("bundle.json", "images not a list", "BundleManifestInvalid", field("images", {"a": 1})),
    ("bundle.json", "pinnedImageSets not a list", "BundleManifestInvalid",
     field("pinnedImageSets", {"a": 1})),
    ("bundle.json", "negative size", "BundleManifestInvalid", field("blobs.0.sizeBytes", -1)),
    ("bundle.json", "size true", "BundleManifestInvalid", field("blobs.0.sizeBytes", True)),
    ("bundle.json", "blob listed twice", "BundleManifestInvalid",
     doc(lambda m: m["blobs"].append(dict(m["blobs"][0])))),
    ("bundle.json", "image listed twice", "BundleManifestInvalid",
     doc(lambda m: m["images"].append(dict(m["images"][0])))),
    ("bundle.json", "manifestDigest other than the name's digest", "BundleManifestInvalid",
     doc(lambda m: _put(m["images"][0], "manifestDigest", m["images"][1]["manifestDigest"]))),
    ("bundle.json", "image named by tag", "BundleManifestInvalid", field("images.0.name", TAG_REF)),
    ("bundle.json", "file path with ..", "BundleUnsafePath",
     doc(lambda m: m["files"].append({"path": "../out", "sha256": "0" * 64, "sizeBytes": 1}))),
    ("bundle.json", "absolute file path", "BundleUnsafePath",
     doc(lambda m: m["files"].append({"path": "/etc/passwd", "sha256": "0" * 64, "sizeBytes": 1}))),
    ("bundle.json", "file listed in a blob's place", "BundleManifestInvalid",
     doc(lambda m: m["files"].append(AT_BLOB_PLACE))),
    ("bundle.json", "bundle for another architecture", "BundleArchitectureMismatch",
     lambda d: _put(d.doc, "architecture", other_architecture(d.platform))),
    ("bundle.json", "image size understated", "BundleSizeMismatch",
     doc(lambda m: _put(m["images"][0], "sizeBytes", m["images"][0]["sizeBytes"] - 1))),

    ("PinnedImageSets", "set name x/../../outside", "BundleSetInvalid",
     the_set("metadata.name", "x/../../outside")),
    ("PinnedImageSets", "set name in upper case", "BundleSetInvalid",
     the_set("metadata.name", "Corpus-Apps")),
    ("PinnedImageSets", "set name of 254 characters", "BundleSetInvalid",
     the_set("metadata.name", "a" * 254)),
    ("PinnedImageSets", "set spec not an object", "BundleSetInvalid", the_set("spec", "all")),
    ("PinnedImageSets", "set label value of 10 MB", "BundleSetInvalid",
     the_set("metadata.labels", {"site": "x" * 10**7})),
    ("PinnedImageSets", "set of another kind", "BundleSetInvalid", the_set("kind", "ConfigMap")),
    ("PinnedImageSets", "two sets of one name", "BundleSetInvalid",
     doc(lambda m: m["pinnedImageSets"].append(copy.deepcopy(m["pinnedImageSets"][0])))),
    ("PinnedImageSets", "set names an image the bundle does not carry", "BundleSetInvalid",
     the_set("spec.pinnedImages.1.name", OTHER_REF)),
    ("PinnedImageSets", "set names an image by tag", "BundleSetInvalid",
     the_set("spec.pinnedImages.1.name", TAG_REF)),

    ("images", "image whose manifest is not in the bundle", "BundleIncomplete", _manifest_missing),
    ("images", "layer not in the bundle", "BundleIncomplete", drop("app_layer")),
    ("images", "config not in the bundle", "BundleIncomplete", drop("app_config")),
    ("images", "index without this platform's manifest", "BundleIncomplete", drop("multi_child")),
    ("images", "index offering no manifest for this platform", "BundleArchitectureMismatch",
     _index_without_my_platform),
    ("images", "index.json names a blob the bundle does not list", "BundleIncomplete",
     index_json(lambda i: i["manifests"].append(UNLISTED_ENTRY))),
    ("images", "index.json does not name an image", "BundleManifestInvalid",
     index_json(lambda i: i["manifests"].pop(0))),
    ("images", "layer size in the manifest differs from the listed size", "BundleSizeMismatch",
     edit("app_manifest", lambda m: _put(m["layers"][-1], "size", m["layers"][-1]["size"] + 1))),
    ("images", "image config for another architecture", "BundleArchitectureMismatch",
     _config_of_other_architecture),
    ("images", "image manifest that is not JSON", "BundleManifestInvalid",
     replace("app_manifest", b"\x00\x01 not a manifest")),
    ("images", "image manifest nested 1,000 deep", "BundleManifestInvalid",
     replace("app_manifest", b"[" * 1000 + b"]" * 1000)),
    ("images", "image manifest of 4 MiB of empty arrays", "BundleManifestInvalid",
     replace("app_manifest", b"[" + b"[]," * 1_398_000 + b"[]]")),
    ("images", "image manifest of an unsupported media type", "BundleManifestInvalid",
     edit("app_manifest", lambda m: _put(m, "mediaType", SCHEMA1))),
    ("images", "image manifest of schemaVersion 1", "BundleManifestInvalid",
     edit("app_manifest", lambda m: _put(m, "schemaVersion", 1))),
    ("images", "config descriptor that is not a digest", "BundleManifestInvalid",
     edit("app_manifest", lambda m: _put(m["config"], "digest", "../../etc/passwd"))),
    ("images", "index entry for this platform is an index", "BundleManifestInvalid",
     replace("multi_child", NESTED_INDEX)),
    ("images", "oci-layout of another version", "BundleManifestInvalid",
     lambda d: d.set_file("oci-layout", b'{"imageLayoutVersion":"2.0.0"}')),
    ("images", "oci-layout not listed", "BundleIncomplete",
     lambda d: d.set_file("oci-layout", None)),
    ("images", "image config that is not JSON", "BundleManifestInvalid",
     replace("app_config", b"\xff\xfe")),

    ("tree", "unlisted file at the root", "BundleUnlistedFile", on_disk(add_file("README"))),
    ("tree", "unlisted blob", "BundleUnlistedFile", on_disk(add_file("blobs/sha256/" + "0" * 64))),
    ("tree", "unlisted directory", "BundleUnlistedFile", on_disk(add_dir("blobs/sha512"))),
    ("tree", "file inside lost+found", "BundleUnlistedFile", on_disk(add_file("lost+found/#12"))),
    ("tree", "file inside System Volume Information", "BundleUnlistedFile",
     on_disk(add_file("System Volume Information/IndexerVolumeGuid"))),
    ("tree", "lost+found below the root", "BundleUnlistedFile",
     on_disk(add_dir("blobs/lost+found"))),
    ("tree", "file name holding terminal escape sequences", "BundleUnlistedFile",
     on_disk(add_file(ESCAPES))),
    ("tree", "symbolic link in place of a blob", "BundleUnsafeEntry", at("app_layer", link_out)),
    ("tree", "blob directory is a symbolic link", "BundleUnsafeEntry", on_disk(link_out("blobs"))),
    ("tree", "FIFO", "BundleUnsafeEntry", on_disk(mkfifo("pipe"))),
    ("tree", "device node", "BundleUnsafeEntry", on_disk(mknod("null"))),
    ("tree", "listed layer missing from the medium", "BundleIncomplete", at("app_layer", _remove)),
    ("tree", "blob longer than listed", "BundleSizeMismatch",
     at("app_layer", lambda p: resize(p, 1))),
    ("tree", "blob shorter than listed", "BundleSizeMismatch",
     at("app_layer", lambda p: resize(p, -1))),
    ("tree", "flipped byte in an image manifest", "BundleDigestMismatch",
     at("app_manifest", flip_byte)),
    ("tree", "flipped byte in an image config", "BundleDigestMismatch",
     at("app_config", flip_byte)),
    ("tree", "flipped byte in index.json", "BundleDigestMismatch",
     on_disk(flip_byte("index.json"))),
]
# fmt: on

CASES: dict[str, Case] = {
    name: Case(name, group, flaw, reason) for group, name, reason, flaw in _TABLE
}
CASES["flipped byte in the shared base layer"] = Case(
    "flipped byte in the shared base layer",
    "tree",
    at("base_layer", flip_byte),
    "BundleDigestMismatch",
    stage="serve",
)
assert len(CASES) == len(_TABLE) + 1, "two flaws of one name"
