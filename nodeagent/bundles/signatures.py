"""Image signatures a bundle carries: sigstore attachments, and whether CRI-O will read them.

A registry holding sigstore (cosign-format) signatures keeps them beside each image, in the
same repository, under the tag ``sha256-<hex>.sig`` (the hex of the signed manifest's
digest): an OCI image manifest whose layers are simple-signing payloads, each with its
signature in the ``dev.cosignproject.cosign/signature`` annotation (docs/runtime-facts.md,
"Sigstore signatures"). ``bundle create --with-signatures`` carries that manifest and its
blobs like every other content; ``bundle.json``'s ``imageSignatures`` (format version 3)
names, for each signed image, the tag and the manifest digest; the loopback mirror serves
the tag only when it is listed there (docs/bundle-format.md, "Image signatures").

CRI-O looks for those tags only where containers-registries.d(5) sets
``use-sigstore-attachments: true`` for the reference it pulls from. ``parse_registries_d``
reads that directory's files (bounded, strictly), ``uses_sigstore_attachments`` answers
for one reference as containers/image does, and ``sigstore_findings`` says which signed
images of a bundle CRI-O would pull without looking at their signatures (reason code
``SigstoreAttachmentsOff``) or why it could not pull at all (``RegistriesDInvalid``).

Pure functions only; the directory is read by ``nodeagent.adapters.bundles.registries_d``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from nodeagent.bundles.target import FRESHNESS_FORMAT_VERSION
from nodeagent.errors import BundleManifestInvalid
from nodeagent.references import PinnedImageRef
from nodeagent.registries import DOCKER_HUB, normalize_registry
from nodeagent.strict import MalformedInput, clip, load_yaml, loads_json, quoted

SIGNATURES_KEY: Final = "imageSignatures"
SIGNATURE_KEYS: Final = frozenset({"image", "tag", "manifest"})
MAX_SIGNATURE_MANIFEST_BYTES: Final = 4 << 20
"""A signature manifest is served as a manifest: the loopback mirror's bound for those."""
SIGNATURE_LAYER_TYPE: Final = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION: Final = "dev.cosignproject.cosign/signature"
MAX_REGISTRIES_D_FILES: Final = 256
MAX_REGISTRIES_D_FILE_BYTES: Final = 1 << 20
"""One registries.d file: real ones are a few hundred bytes."""
_REGISTRIES_D_DEPTH: Final = 8
_REGISTRIES_D_NODES: Final = 100_000
ATTACHMENTS_KEY: Final = "use-sigstore-attachments"
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_TAG = re.compile(r"^sha256-(?P<hex>[a-f0-9]{64})\.sig$")


class _Listed(Protocol):
    @property
    def size_bytes(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ImageSignature:
    """One signed image of the bundle: its sigstore tag and the manifest stored under it."""

    image: PinnedImageRef
    tag: str
    manifest_digest: str

    @property
    def served_name(self) -> str:
        """``<repository path>/<tag>``: what the runtime asks the loopback mirror for."""
        return f"{repository_path(self.image)}/{self.tag}"


def signature_tag(digest: str) -> str:
    """The sigstore tag of the image whose manifest digest is ``digest``."""
    if not _DIGEST.match(digest):
        raise ValueError(f"{digest!r} is not a sha256 digest")
    return digest.replace(":", "-", 1) + ".sig"


def tag_digest(tag: str) -> str | None:
    """The manifest digest a sigstore tag names, or None when ``tag`` is not one."""
    match = _TAG.match(tag)
    return None if match is None else f"sha256:{match['hex']}"


def repository_path(ref: PinnedImageRef) -> str:
    """The repository as the runtime names it to a mirror (Docker Hub's ``library/`` added)."""
    if normalize_registry(ref.host) == DOCKER_HUB and "/" not in ref.repository:
        return f"library/{ref.repository}"
    return ref.repository


# ---------------------------------------------------------------- bundle.json
def signatures_doc(signatures: Iterable[ImageSignature]) -> list[dict[str, str]]:
    """``imageSignatures`` as ``bundle.json`` holds it (sorted by image)."""
    return [
        {"image": str(s.image), "tag": s.tag, "manifest": s.manifest_digest}
        for s in sorted(signatures, key=lambda s: str(s.image))
    ]


def image_signatures_of(
    doc: Mapping[str, Any],
    images: Iterable[PinnedImageRef],
    blobs: Mapping[str, _Listed],
) -> tuple[ImageSignature, ...]:
    """``bundle.json``'s ``imageSignatures`` (format version 3), checked against its images
    and blobs: each names a carried image, that image's tag, and a listed blob."""
    if SIGNATURES_KEY not in doc:
        return ()
    version = doc.get("formatVersion")
    if not isinstance(version, int) or version < FRESHNESS_FORMAT_VERSION:
        raise BundleManifestInvalid(
            f"bundle.json: {SIGNATURES_KEY} needs formatVersion {FRESHNESS_FORMAT_VERSION} "
            "(an older nodeagent would ignore them)"
        )
    items = doc[SIGNATURES_KEY]
    if not isinstance(items, list):
        raise BundleManifestInvalid(f"bundle.json: {SIGNATURES_KEY} must be a list")
    carried = {str(ref): ref for ref in images}
    found: dict[str, ImageSignature] = {}
    for index, item in enumerate(items):
        where = f"bundle.json {SIGNATURES_KEY}[{index}]"
        signature = _signature(item, where, carried, blobs)
        if found.setdefault(str(signature.image), signature) is not signature:
            raise BundleManifestInvalid(f"{where}: {signature.image} is listed twice")
    return tuple(found.values())


def _signature(
    item: object, where: str, carried: Mapping[str, PinnedImageRef], blobs: Mapping[str, _Listed]
) -> ImageSignature:
    if not isinstance(item, dict):
        raise BundleManifestInvalid(f"{where} must be an object")
    unknown = sorted(set(item) - SIGNATURE_KEYS)
    if unknown or set(item) != SIGNATURE_KEYS:
        shown = quoted(unknown[0], 60) if unknown else "image, tag and manifest"
        raise BundleManifestInvalid(f"{where}: holds exactly image, tag and manifest ({shown})")
    image, tag, digest = item["image"], item["tag"], item["manifest"]
    ref = carried.get(image) if isinstance(image, str) else None
    if ref is None:
        raise BundleManifestInvalid(f"{where}: {quoted(image, 200)} is not an image of the bundle")
    if tag != signature_tag(ref.digest):
        raise BundleManifestInvalid(
            f"{where}: tag {quoted(tag, 80)} is not {signature_tag(ref.digest)}, the sigstore "
            f"tag of {ref}"
        )
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise BundleManifestInvalid(f"{where}: manifest {quoted(digest, 80)} is not a digest")
    listed = blobs.get(digest)
    if listed is None:
        raise BundleManifestInvalid(f"{where}: manifest {digest} is not listed in blobs")
    size = listed.size_bytes
    if size > MAX_SIGNATURE_MANIFEST_BYTES:
        raise BundleManifestInvalid(
            f"{where}: manifest {digest} is {size} bytes, at most {MAX_SIGNATURE_MANIFEST_BYTES}"
        )
    return ImageSignature(ref, tag, digest)


def signature_manifest_blobs(data: bytes) -> dict[str, int] | None:
    """Digest → size of the blobs a signature manifest names (its config and layers), or
    None when ``data`` is not an image manifest (strict JSON, bounded like the mirror's)."""
    try:
        doc = loads_json(data, what="signature manifest", max_bytes=MAX_SIGNATURE_MANIFEST_BYTES)
    except MalformedInput:
        return None
    if not isinstance(doc, dict):
        return None
    layers = doc.get("layers")
    items = [doc.get("config"), *(layers if isinstance(layers, list) else [None])]
    found: dict[str, int] = {}
    for item in items:
        if not isinstance(item, dict):
            return None
        digest, size = item.get("digest"), item.get("size")
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            return None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return None
        found[digest] = size
    return found


def served_tags(signatures: Iterable[ImageSignature]) -> dict[str, str]:
    """``<repository path>/<tag>`` → manifest digest: the only tags the loopback mirror serves."""
    return {s.served_name: s.manifest_digest for s in signatures}


# ---------------------------------------------------------------- registries.d
@dataclass(frozen=True, slots=True)
class AttachmentScopes:
    """What registries.d says about sigstore attachments: only sections that set the key."""

    default: bool | None = None
    """``default-docker``'s ``use-sigstore-attachments``, None when it does not set it."""
    namespaces: Mapping[str, bool] = field(default_factory=dict)
    """``docker: <scope>:`` → its ``use-sigstore-attachments``."""
    problems: tuple[str, ...] = ()
    """Why containers/image would refuse the directory (then it pulls nothing at all)."""


def parse_registries_d(files: Sequence[tuple[str, bytes]]) -> AttachmentScopes:
    """The ``*.yaml`` files of a registries.d directory (name, bytes), merged as
    containers/image merges them: one ``default-docker`` and each scope once over all files."""
    default: bool | None = None
    default_from = ""
    namespaces: dict[str, bool] = {}
    seen: dict[str, str] = {}
    problems: list[str] = []
    if len(files) > MAX_REGISTRIES_D_FILES:
        problems.append(f"more than {MAX_REGISTRIES_D_FILES} files; only the first were read")
    for name, data in sorted(files)[:MAX_REGISTRIES_D_FILES]:
        doc = _registries_d_doc(name, data)
        if isinstance(doc, str):
            problems.append(doc)
            continue
        if "default-docker" in doc:
            if default_from:
                problems.append(f"default-docker is set in both {default_from} and {clip(name)}")
            default_from = clip(name)
            default = _attachments(doc["default-docker"], name, "default-docker", problems)
        for scope, section in _sections(doc.get("docker"), name, problems):
            if scope in seen:
                problems.append(
                    f"docker scope {quoted(scope, 120)} is set in {seen[scope]} and {clip(name)}"
                )
            seen[scope] = clip(name)
            value = _attachments(section, name, f"docker {quoted(scope, 120)}", problems)
            if value is not None:
                namespaces[scope] = value
    return AttachmentScopes(default, namespaces, tuple(problems))


def _registries_d_doc(name: str, data: bytes) -> dict[str, Any] | str:
    """The file's mapping, or why containers/image would refuse it."""
    try:
        docs = load_yaml(
            data, what=clip(name), max_bytes=MAX_REGISTRIES_D_FILE_BYTES,
            max_depth=_REGISTRIES_D_DEPTH, max_nodes=_REGISTRIES_D_NODES,
        )  # fmt: skip
    except MalformedInput as exc:
        return clip(f"{clip(name)}: {exc}", 300)
    if len(docs) > 1:
        return f"{clip(name)}: holds {len(docs)} YAML documents, not one"
    doc = docs[0] if docs else None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        return f"{clip(name)}: must hold a mapping (default-docker, docker)"
    return doc


def _sections(value: object, name: str, problems: list[str]) -> list[tuple[str, object]]:
    if value is None:
        return []
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        problems.append(f"{clip(name)}: docker must map scopes to sections")
        return []
    return list(value.items())


def _attachments(section: object, name: str, where: str, problems: list[str]) -> bool | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        problems.append(f"{clip(name)}: {where} must be a mapping")
        return None
    value = section.get(ATTACHMENTS_KEY)
    if value is None or isinstance(value, bool):
        return value
    problems.append(f"{clip(name)}: {where} {ATTACHMENTS_KEY} must be true or false")
    return None


def scope_names(name: str, digest: str) -> list[str]:
    """The scopes containers/image tries for ``host/repo@digest``, most specific first: the
    reference itself, the repository and each parent, then ``*.domain`` wildcards."""
    names = [f"{name}@{digest}"]
    current = name
    while True:
        names.append(current)
        if "/" not in current:
            break
        current = current.rpartition("/")[0]
    host = current.partition(":")[0]
    while "." in host:
        host = host.partition(".")[2]
        names.append(f"*.{host}")
    return names


def uses_sigstore_attachments(scopes: AttachmentScopes, name: str, digest: str) -> bool:
    """Whether CRI-O looks for sigstore attachments when pulling ``name@digest`` from there
    (``name``: ``host[:port]/repository`` as the runtime spells it)."""
    for scope in scope_names(name, digest):
        value = scopes.namespaces.get(scope)
        if value is not None:
            return value
    return bool(scopes.default)


# ---------------------------------------------------------------- findings
FindingCode = Literal["SigstoreAttachmentsOff", "RegistriesDInvalid"]


@dataclass(frozen=True, slots=True)
class SigstoreFinding:
    """One thing that stops CRI-O from checking a carried signature; what to do about it."""

    code: FindingCode
    subject: str
    """The image, or the registries.d directory."""
    message: str
    action: str


def runtime_name(ref: PinnedImageRef) -> str:
    """``host[:port]/repository`` as containers/image normalizes it (Docker Hub's aliases)."""
    return f"{normalize_registry(ref.host)}/{repository_path(ref)}"


def sigstore_findings(
    signatures: Iterable[ImageSignature], scopes: AttachmentScopes, *, directory: str
) -> list[SigstoreFinding]:
    """What keeps CRI-O from reading the carried signatures, for ``check-offline`` and the
    importer: a registries.d it would refuse, then each signed image whose registry scope
    does not set ``use-sigstore-attachments: true``."""
    findings = [
        SigstoreFinding(
            "RegistriesDInvalid", directory, problem,
            f"fix the file in {directory}: containers/image refuses the whole directory, "
            "and then CRI-O pulls nothing",
        )
        for problem in scopes.problems
    ]  # fmt: skip
    for signature in signatures:
        name = runtime_name(signature.image)
        if uses_sigstore_attachments(scopes, name, signature.image.digest):
            continue
        host = name.partition("/")[0]
        findings.append(
            SigstoreFinding(
                "SigstoreAttachmentsOff",
                str(signature.image),
                f"{signature.image} carries a sigstore signature, and no registries.d entry "
                f"sets {ATTACHMENTS_KEY}: true for it, so CRI-O never reads that signature "
                "and a policy that requires one refuses the image",
                f"add a file to {directory} with 'docker: {{{host}: {{{ATTACHMENTS_KEY}: "
                "true}}' (or set it under default-docker)",
            )
        )
    return findings


def mirror_attachments_dropin(mirror_host: str) -> str:
    """A registries.d file that makes the runtime read sigstore attachments from the loopback
    mirror: containers/image decides per reference it pulls from, which during an import is
    the mirror's ``127.0.0.1:<port>/…`` (docs/runtime-facts.md)."""
    return (
        "# Written by nodeagent while it imports an offline bundle; removed afterwards.\n"
        f"docker:\n  {mirror_host}:\n    {ATTACHMENTS_KEY}: true\n"
    )
