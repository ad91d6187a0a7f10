"""OpenShift release bundles: a release image's payload, its signatures, what comes next (pure).

A release image (``oc adm release info``) carries two files this module reads
(docs/runtime-facts.md#openshift-release-images):

- ``release-manifests/image-references``: an ImageStream whose ``spec.tags[]`` name every
  payload image (``name``: the component, ``from.name``: its pull spec by digest);
- ``release-manifests/release-metadata``: JSON whose ``version`` is the release's version
  and whose ``previous`` lists the versions it upgrades from (the upgrade-path check,
  ``cluster.clusterversion.check_upgrade_path``; a metadata without it upgrades from none).

``bundle create --release`` puts the release image and every payload image in the bundle,
with a PinnedImageSet ``release-<version>``, and carries the release's signatures as files;
``bundle.json`` names them in its ``release`` object (format version 3,
docs/bundle-format.md#release). On the node, ``signature_config_map`` renders the ConfigMap
the cluster-version operator reads the signatures from, and ``next_steps`` what a node says
once the release set is pinned: that this node is ready, and where the site's admin sees
every node. A node never tells its reader to start the upgrade: only the site view does
(``nodeagent site status``, the one-touch starter, docs/upgrade.md; decision 0073).

Reading the layers is ``nodeagent.adapters.bundles.release``; everything here is pure.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from nodeagent.errors import BundleReleaseInvalid, ImageReferenceInvalid, ReleaseImageInvalid
from nodeagent.references import PinnedImageRef, parse_pinned_image_ref
from nodeagent.specs import PinnedImageSet
from nodeagent.strict import MalformedInput, clip, loads_json, quoted

IMAGE_REFERENCES_PATH: Final = "release-manifests/image-references"
RELEASE_METADATA_PATH: Final = "release-manifests/release-metadata"
RELEASE_FILES: Final = (IMAGE_REFERENCES_PATH, RELEASE_METADATA_PATH)
MAX_RELEASE_FILE_BYTES: Final = 4 * 1024 * 1024
"""Either file: a real ``image-references`` of ~190 tags is about 60 KB."""
MAX_PAYLOAD_IMAGES: Final = 500
"""Payload images of one release (OpenShift 4.x has about 180): a PinnedImageSet's limit."""
MAX_PREVIOUS: Final = 1000
"""Versions a release upgrades from (``previous``): a 4.y.z lists a few dozen."""
MAX_SIGNATURES: Final = 16
"""Signatures of one release digest a bundle carries (the CVO's stores keep 1 or 2)."""
MAX_SIGNATURE_BYTES: Final = 64 * 1024
"""One signature: an OpenPGP-signed JSON document of about 1 KB."""
SIGNATURES_DIR: Final = "release-signatures"
SIGNATURE_NAMESPACE: Final = "openshift-config-managed"
SIGNATURE_LABEL: Final = "release.openshift.io/verification-signatures"

_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,62}$")
_TAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_HEX = re.compile(r"^[a-f0-9]{64}$")
_STORE_DIR = re.compile(r"^sha256=([a-f0-9]{64})$")
_STORE_FILE = re.compile(r"^signature-([1-9][0-9]{0,3})$")
_RELEASE_KEYS: Final = frozenset({"image", "version", "set", "signatures", "previous"})
_SIGNATURE_KEYS: Final = frozenset({"digest", "index", "path", "sizeBytes", "sha256"})
RELEASE_FORMAT_VERSION_MIN: Final = 3


@dataclass(frozen=True, slots=True)
class PayloadImage:
    name: str
    """The component (``spec.tags[].name``), e.g. ``machine-config-operator``."""
    ref: PinnedImageRef


@dataclass(frozen=True, slots=True)
class ReleasePayload:
    """What a release image says about itself."""

    version: str
    images: tuple[PayloadImage, ...]
    previous: tuple[str, ...] = ()
    """``release-metadata``'s ``previous``: the versions it upgrades from."""


@dataclass(frozen=True, slots=True)
class ReleaseSignature:
    """One signature file the bundle carries: of ``digest``, the ``index``-th (from 1)."""

    digest: str
    index: int
    path: str
    size_bytes: int
    sha256_hex: str

    @property
    def key(self) -> str:
        """The ConfigMap ``binaryData`` key: ``sha256-<hex>-<index>``."""
        return f"{self.digest.replace(':', '-')}-{self.index}"


@dataclass(frozen=True, slots=True)
class BundleRelease:
    """``bundle.json``'s ``release``: the release image, its version, set and signatures."""

    image: PinnedImageRef
    version: str
    set_name: str
    signatures: tuple[ReleaseSignature, ...] = ()
    previous: tuple[str, ...] = ()
    """The versions the release upgrades from (its ``release-metadata``'s ``previous``)."""


class _Listed(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def sha256_hex(self) -> str: ...


class _Image(Protocol):
    @property
    def ref(self) -> PinnedImageRef: ...


class _Set(Protocol):
    @property
    def name(self) -> str: ...


class _Manifest(Protocol):
    """What ``release_of`` needs of ``manifest.BundleManifest`` (which imports this module)."""

    @property
    def files(self) -> Sequence[_Listed]: ...
    @property
    def images(self) -> Sequence[_Image]: ...
    @property
    def sets(self) -> Sequence[_Set]: ...


# ---------------------------------------------------------------- the release image
def _json(data: bytes, path: str) -> Any:
    try:
        return loads_json(data, what=path, max_bytes=MAX_RELEASE_FILE_BYTES, max_depth=16)
    except MalformedInput as exc:
        raise ReleaseImageInvalid(f"the release image's {path}: {exc}") from None


def parse_image_references(data: bytes) -> tuple[PayloadImage, ...]:
    """The payload images ``image-references`` (an ImageStream) names, each by digest, once."""
    doc = _json(data, IMAGE_REFERENCES_PATH)
    where = f"the release image's {IMAGE_REFERENCES_PATH}"
    if not isinstance(doc, dict) or doc.get("kind") != "ImageStream":
        raise ReleaseImageInvalid(f"{where} is not an ImageStream")
    spec = doc.get("spec")
    tags = spec.get("tags") if isinstance(spec, dict) else None
    if not isinstance(tags, list) or not 1 <= len(tags) <= MAX_PAYLOAD_IMAGES:
        raise ReleaseImageInvalid(
            f"{where}: spec.tags must list 1 to {MAX_PAYLOAD_IMAGES} payload images"
        )
    images: dict[str, PayloadImage] = {}
    for index, tag in enumerate(tags):
        image = _payload_image(tag, f"{where} spec.tags[{index}]")
        if images.setdefault(image.name, image) is not image:
            raise ReleaseImageInvalid(f"{where}: tag {image.name} is listed twice")
    return tuple(images.values())


def _payload_image(tag: Any, where: str) -> PayloadImage:
    source = tag.get("from") if isinstance(tag, dict) else None
    name = tag.get("name") if isinstance(tag, dict) else None
    if not isinstance(name, str) or not _TAG_NAME.fullmatch(name) or not isinstance(source, dict):
        raise ReleaseImageInvalid(f"{where}: needs a name and a from object")
    if source.get("kind", "DockerImage") != "DockerImage":
        raise ReleaseImageInvalid(f"{where}: from.kind must be DockerImage")
    pull_spec = source.get("name")
    try:
        ref = parse_pinned_image_ref(pull_spec if isinstance(pull_spec, str) else "")
    except ImageReferenceInvalid as exc:
        raise ReleaseImageInvalid(clip(f"{where} ({name}): {exc.message}", 400)) from None
    return PayloadImage(name, ref)


def parse_release_metadata(data: bytes) -> str:
    """The release's ``version`` from ``release-metadata``."""
    doc = _json(data, RELEASE_METADATA_PATH)
    version = doc.get("version") if isinstance(doc, dict) else None
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise ReleaseImageInvalid(
            f"the release image's {RELEASE_METADATA_PATH}: version {quoted(version, 80)} is not "
            "a release version such as 4.16.3"
        )
    return version


def parse_release_previous(data: bytes) -> tuple[str, ...]:
    """``release-metadata``'s ``previous`` (missing: none), each a release version, once."""
    doc = _json(data, RELEASE_METADATA_PATH)
    value = doc.get("previous", []) if isinstance(doc, dict) else None
    return _previous(
        value, f"the release image's {RELEASE_METADATA_PATH}: previous", ReleaseImageInvalid
    )


def _previous(
    value: object, where: str, error: type[ReleaseImageInvalid | BundleReleaseInvalid]
) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_PREVIOUS:
        raise error(f"{where} must be a list of at most {MAX_PREVIOUS} versions")
    for item in value:
        if not isinstance(item, str) or not _VERSION.fullmatch(item):
            raise error(f"{where}: {quoted(item, 80)} is not a release version such as 4.16.3")
    return tuple(dict.fromkeys(value))


def parse_release_files(files: Mapping[str, bytes]) -> ReleasePayload:
    """Both files, read from the release image's layers; a missing one says which."""
    for path in RELEASE_FILES:
        if path not in files:
            raise ReleaseImageInvalid(
                f"the release image holds no {path}: is it an OpenShift release image "
                "(oc adm release info)?"
            )
    version = parse_release_metadata(files[RELEASE_METADATA_PATH])
    previous = parse_release_previous(files[RELEASE_METADATA_PATH])
    return ReleasePayload(version, parse_image_references(files[IMAGE_REFERENCES_PATH]), previous)


def release_set_name(version: str) -> str:
    """``release-<version>`` as a PinnedImageSet name (lower case, ``+`` and ``_`` as ``-``)."""
    name = "release-" + re.sub(r"[+_]", "-", version.lower())
    return check_set_name(name.rstrip("-."))


def check_set_name(name: str) -> str:
    if not _SET_NAME.fullmatch(name):
        raise ReleaseImageInvalid(f"{quoted(name, 80)} is not a PinnedImageSet name")
    return name


def release_set(
    payload: ReleasePayload, image: PinnedImageRef, set_name: str, *, is_persistent: bool
) -> PinnedImageSet:
    """The PinnedImageSet of a release: its image, then every payload image, each once."""
    refs = dict.fromkeys([image, *(p.ref for p in payload.images)])
    if len(refs) > MAX_PAYLOAD_IMAGES:
        raise ReleaseImageInvalid(
            f"release {payload.version} names {len(refs)} images; a set holds at most "
            f"{MAX_PAYLOAD_IMAGES}"
        )
    return PinnedImageSet(
        name=check_set_name(set_name),
        images=tuple(refs),
        source=f"release {payload.version}",
        is_persistent=is_persistent,
    )


def layer_member_name(name: str) -> str:
    """A tar member's name as a path in the image (``./a/b`` and ``/a/b`` are ``a/b``)."""
    return name.removeprefix("./").lstrip("/")


# ---------------------------------------------------------------- signatures
def signature_path(digest: str, index: int) -> str:
    """Where a signature lives in the bundle: ``release-signatures/sha256-<hex>-<index>``."""
    return f"{SIGNATURES_DIR}/{digest.replace(':', '-')}-{index}"


def store_signature_index(dir_name: str, file_name: str, digest: str) -> int | None:
    """In a signature store (``sha256=<hex>/signature-<n>``): ``n`` when the file is one of
    ``digest``'s signatures, else None."""
    found_dir, found_file = _STORE_DIR.fullmatch(dir_name), _STORE_FILE.fullmatch(file_name)
    if found_dir is None or found_file is None or f"sha256:{found_dir[1]}" != digest:
        return None
    return int(found_file[1])


def check_signature_count(count: int, digest: str) -> None:
    if not 1 <= count <= MAX_SIGNATURES:
        raise ReleaseImageInvalid(
            f"{count} signatures of {digest}: a bundle carries 1 to {MAX_SIGNATURES}"
        )


def release_doc(release: BundleRelease) -> dict[str, Any]:
    """``bundle.json``'s ``release`` object."""
    signatures = [
        {"digest": s.digest, "index": s.index, "path": s.path, "sizeBytes": s.size_bytes,
         "sha256": s.sha256_hex}
        for s in release.signatures
    ]  # fmt: skip
    doc: dict[str, Any] = {
        "image": str(release.image),
        "version": release.version,
        "set": release.set_name,
        "signatures": signatures,
    }
    if release.previous:
        doc["previous"] = list(release.previous)
    return doc


# ---------------------------------------------------------------- bundle.json's release
def _bad(message: str) -> BundleReleaseInvalid:
    return BundleReleaseInvalid(f"bundle.json release: {message}")


def release_of(doc: Mapping[str, Any], manifest: _Manifest) -> BundleRelease | None:
    """``bundle.json``'s optional ``release`` (rules R31 and R32 of docs/bundle-format.md),
    checked against the rest of the parsed ``manifest``."""
    if "release" not in doc:
        return None
    files = {f.path: f for f in manifest.files}
    images = [i.ref for i in manifest.images]
    set_names = [s.name for s in manifest.sets]
    version = doc.get("formatVersion")
    if not isinstance(version, int) or version < RELEASE_FORMAT_VERSION_MIN:
        raise _bad(f"needs formatVersion {RELEASE_FORMAT_VERSION_MIN} or later")
    value = doc["release"]
    if not isinstance(value, dict) or set(value) - _RELEASE_KEYS:
        raise _bad(f"must be an object holding only {', '.join(sorted(_RELEASE_KEYS))}")
    release = BundleRelease(
        image=_release_image(value.get("image"), images),
        version=_text(value, "version", _VERSION),
        set_name=_text(value, "set", _SET_NAME),
        signatures=_signatures(value.get("signatures"), files),
        previous=_previous(
            value.get("previous", []), "bundle.json release: previous", BundleReleaseInvalid
        ),
    )
    if release.set_name not in set(set_names):
        raise _bad(f"set {release.set_name} is not one of the bundle's PinnedImageSets")
    for signature in release.signatures:
        if signature.digest != release.image.digest:
            raise _bad(f"signature {signature.key} is not of the release image {release.image}")
    return release


def _text(value: Mapping[str, Any], key: str, pattern: re.Pattern[str]) -> str:
    text = value.get(key)
    if not isinstance(text, str) or not pattern.fullmatch(text):
        raise _bad(f"{key} {quoted(text, 100)} is not valid")
    return text


def _release_image(text: object, images: Iterable[PinnedImageRef]) -> PinnedImageRef:
    try:
        ref = parse_pinned_image_ref(text if isinstance(text, str) else "")
    except ImageReferenceInvalid as exc:
        raise _bad(clip(f"image: {exc.message}", 400)) from None
    if ref not in set(images):
        raise _bad(f"image {ref} is not one of the bundle's images")
    return ref


def _signatures(value: object, files: Mapping[str, _Listed]) -> tuple[ReleaseSignature, ...]:
    if not isinstance(value, list) or len(value) > MAX_SIGNATURES:
        raise _bad(f"signatures must be a list of at most {MAX_SIGNATURES}")
    found: dict[str, ReleaseSignature] = {}
    for index, item in enumerate(value):
        signature = _signature(item, f"signatures[{index}]", files)
        if found.setdefault(signature.key, signature) is not signature:
            raise _bad(f"signatures[{index}]: {signature.key} is listed twice")
    return tuple(found.values())


def _signature(item: object, where: str, files: Mapping[str, _Listed]) -> ReleaseSignature:
    if not isinstance(item, dict) or set(item) != _SIGNATURE_KEYS:
        raise _bad(f"{where} must hold exactly {', '.join(sorted(_SIGNATURE_KEYS))}")
    digest, index = item["digest"], item["index"]
    path, size, hex_part = item["path"], item["sizeBytes"], item["sha256"]
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise _bad(f"{where}: digest must be sha256:<64 hex>")
    if type(index) is not int or not 1 <= index <= 9999:
        raise _bad(f"{where}: index must be an integer from 1 to 9999")
    if path != signature_path(digest, index):
        raise _bad(f"{where}: path must be {signature_path(digest, index)}")
    listed = files.get(path)
    if listed is None or (listed.size_bytes, listed.sha256_hex) != (size, hex_part):
        raise _bad(f"{where}: {path} is not listed in files[] with this size and sha256")
    if not isinstance(hex_part, str) or not _HEX.fullmatch(hex_part) or size > MAX_SIGNATURE_BYTES:
        raise _bad(f"{where}: a signature is at most {MAX_SIGNATURE_BYTES} bytes")
    return ReleaseSignature(digest, index, path, size, hex_part)


# ---------------------------------------------------------------- on the node
def config_map_name(release: BundleRelease) -> str:
    """One ConfigMap per release digest, as ``oc adm release mirror`` names its own."""
    return release.image.digest.replace(":", "-")


def signature_config_map(
    release: BundleRelease, contents: Mapping[str, bytes], *, bundle_id: str
) -> dict[str, Any]:
    """The ConfigMap the cluster-version operator reads a release's signatures from.

    ``contents`` maps each signature's ``path`` to its bytes, already checked against the
    signed manifest. Namespace, label and keys: docs/runtime-facts.md#release-signatures.
    """
    binary = {s.key: base64.b64encode(contents[s.path]).decode("ascii") for s in release.signatures}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(release),
            "namespace": SIGNATURE_NAMESPACE,
            "labels": {SIGNATURE_LABEL: ""},
            "annotations": {
                "nodeagent.openshift.io/bundle": bundle_id,
                "nodeagent.openshift.io/release-version": release.version,
            },
        },
        "binaryData": binary,
    }


def signature_additions(config_map: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that adds ``config_map``'s signatures (and sets its label and
    annotations) on the ConfigMap of that name another node made: it names no key to remove,
    so the keys already there stay (an update by a node may only add keys, decision 0051)."""
    metadata = config_map["metadata"]
    return {
        "metadata": {
            "labels": dict(metadata["labels"]),
            "annotations": dict(metadata["annotations"]),
        },
        "binaryData": dict(config_map["binaryData"]),
    }


def render_yaml(config_map: Mapping[str, Any]) -> str:
    """The ConfigMap as YAML for ``oc apply -f``; every scalar is JSON-quoted (valid YAML)."""
    lines: list[str] = []
    _yaml_lines(config_map, 0, lines)
    return "\n".join(lines) + "\n"


def _yaml_lines(value: Mapping[str, Any], indent: int, out: list[str]) -> None:
    pad = "  " * indent
    for key, item in value.items():
        if isinstance(item, Mapping):
            out.append(f"{pad}{json.dumps(key)}:" + ("" if item else " {}"))
            _yaml_lines(item, indent + 1, out)
        else:
            out.append(f"{pad}{json.dumps(key)}: {json.dumps(item)}")


def next_steps(release: BundleRelease, bundle_id: str) -> Sequence[str]:
    """What a node says once the release set is pinned here (decision 0073): this node is
    ready, and where the site's admin sees every node. ``BundleBoard`` adds how many nodes
    are ready where this node can know it (``status.site_line``)."""
    return (
        f"release {clip(release.version, 64)} is pinned on this node "
        f"(PinnedImageSet {release.set_name})",
        f"the site's admin sees every node with: nodeagent site status --bundle {bundle_id} "
        f"--set {release.set_name} (docs/upgrade.md)",
    )
