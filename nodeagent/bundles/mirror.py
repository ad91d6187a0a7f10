"""Offline import through a loopback mirror: what the bundle server serves, and the drop-in.

An upgrade bundle is imported by serving its content read-only on loopback
(``nodeagent.adapters.http.mirror``) and pointing the runtime at that server
as a *mirror* of each image's original repository, so that CRI-O pulls every
image by its original name, checks every digest itself, and stores the image
under the name it will run by. Pure functions only (no I/O):

* ``served_blobs`` turns a verified ``BundleManifest`` into the allow-list the
  server serves from: digest → ``ExpectedFile``. Nothing else is ever served.
* ``mirror_repositories`` lists the source repositories (``host[:port]/repo``)
  of the bundle's images, spelled as containers-image matches them.
* ``render_mirror_dropin`` (``registries.dropin``, re-exported here) renders the
  registries.conf.d drop-in (containers-registries.conf(5), v2 format; drop-ins must be
  v2), each entry restating the one that applied to its repository before
  (``applying_entry``) with the loopback mirror added first.
* ``tag_only_mirror`` (``registries.dropin``, re-exported here): the mirror table that
  sends pulls by tag of a repository to the mirror (``pull-from-mirror = "tag-only"``), for
  the tags a verified manifest serves (``bundles.tags``);
* the server's wire rules: ``route`` (which request is a manifest or blob fetch
  by digest, or a tag's, and the distribution error for every other), ``parse_range``,
  ``content_range``, ``manifest_media_type``. HTTP itself is aiohttp's
  (docs/decisions/0027).

Semantics relied on (containers/image ``pkg/sysregistriesv2``):

* the ``[[registry]]`` with the longest ``prefix`` matching the reference is
  the only one used; a per-repository prefix leaves every other repository of
  the same host to its own configuration;
* a mirror's ``location`` replaces the ``prefix`` part of the reference, so
  ``host/repo@sha256:…`` is fetched as ``127.0.0.1:<port>/repo@sha256:…`` while
  the image keeps the name ``host/repo@sha256:…``;
* ``pull-from-mirror = "digest-only"`` (per mirror) skips the mirror for pulls
  by tag; it must not be combined with the registry-wide
  ``mirror-by-digest-only`` (the file is then refused) and is set on the
  mirror table only (on ``[[registry]]`` it is an error); so the drop-in writes the
  per-mirror form only, an ICSP entry's ``mirror-by-digest-only`` turned into
  ``digest-only`` on each of its mirrors (the same pulls);
* unknown keys are ignored with a debug message only, so a misspelt key fails
  silently: the integration test proves both that the mirror is used for a
  digest and that it is skipped for a tag;
* drop-ins are read in lexical order, non-recursively, only ``*.conf``; a later
  drop-in's ``[[registry]]`` with the same ``prefix`` replaces an earlier one
  whole, so the drop-in's name should sort after other components' files, and its entry
  must restate what it replaces (mirrors, ``insecure``, ``blocked``, pull policies);
* ``blocked`` is checked against the reference actually pulled from (containers/image
  ``newDockerClient``): a blocked source's mirrors are still used, the source never.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from nodeagent.bundles.content import MAX_DOCUMENT_VALUES
from nodeagent.bundles.manifest import BundleManifest, ExpectedFile, count_values
from nodeagent.bundles.signatures import tag_digest
from nodeagent.bundles.tags import is_tag
from nodeagent.references import PinnedImageRef
from nodeagent.registries import MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_OCI_MANIFEST
from nodeagent.registries.dropin import IMPORT_HEADER as IMPORT_HEADER
from nodeagent.registries.dropin import NODE_MIRROR_HEADER as NODE_MIRROR_HEADER
from nodeagent.registries.dropin import applying_entry as applying_entry
from nodeagent.registries.dropin import blocked_sources as blocked_sources
from nodeagent.registries.dropin import is_mirrorable as is_mirrorable
from nodeagent.registries.dropin import is_repository_name as is_repository_name
from nodeagent.registries.dropin import render_mirror_dropin as render_mirror_dropin
from nodeagent.registries.dropin import repository_name
from nodeagent.registries.dropin import tag_only_mirror as tag_only_mirror
from nodeagent.strict import MalformedInput, loads_json

DROPIN_NAME: Final = "99-nodeagent-bundle-mirror.conf"
"""Default file name in registries.conf.d: ``.conf`` (else ignored), sorting late."""


PROBE_REPOSITORY: Final = "127.0.0.1:1/nodeagent-mirror-probe"
"""Mirrored with the images at every session, never served: its own registry is a loopback
port nothing listens on, so a pull of ``PROBE_REF`` reaches the loopback server only once
the runtime applied the mirror, and otherwise leaves the machine nowhere."""
PROBE_REF: Final = f"{PROBE_REPOSITORY}@sha256:{'0' * 64}"


def served_blobs(manifest: BundleManifest) -> dict[str, ExpectedFile]:
    """Digest → file for every blob the manifest lists (manifests, configs, layers)."""
    return dict(manifest.blobs)


def mirror_repositories(images: Iterable[PinnedImageRef]) -> tuple[str, ...]:
    """Sorted unique ``host[:port]/repository`` of ``images``, normalized as containers-image.

    Docker Hub's aliases become ``docker.io`` and its one-segment names gain
    ``library/``, as the runtime's reference parser does before matching prefixes.
    """
    return tuple(sorted({repository_name(ref.host, ref.repository) for ref in images}))


def total_size_bytes(blobs: Mapping[str, ExpectedFile]) -> int:
    """Bytes the server would send to serve every blob once (the import's byte total)."""
    return sum(file.size_bytes for file in blobs.values())


# ------------------------------------------------------------------ the mirror's wire rules
_ROUTE: Final = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")
_DIGEST: Final = re.compile(r"^sha256:[a-f0-9]{64}$")
MAX_RANGE_DIGITS: Final = 19
"""Longer positions are ignored with the header (19 digits pass 2^63; blobs are far smaller)."""
MAX_RANGE_HEADER_CHARS: Final = 64
"""A longer ``Range`` is ignored unread: one range of two 19-digit positions is 45 characters."""
_POSITION: Final = f"([0-9]{{0,{MAX_RANGE_DIGITS}}})"
_RANGE: Final = re.compile(f"bytes={_POSITION}-{_POSITION}")
API_VERSION_HEADER: Final = {"Docker-Distribution-API-Version": "registry/2.0"}
MANIFEST_DEPTH: Final = 32
"""Manifests nest 4 deep; a deeper body is not served as a manifest."""


@dataclass(frozen=True, slots=True)
class ServedCounters:
    """What the runtime has fetched from the bundle server so far (import progress)."""

    requests: int = 0
    manifests_served: int = 0
    blobs_served: int = 0
    """Complete (non-range) blob bodies sent."""
    bytes_served: int = 0
    """Manifest and blob body bytes sent, partial ones included."""
    bytes_hashed: int = 0


class RangeNotSatisfiable(ValueError):
    """A byte range that starts at or past the end of the blob."""


@dataclass(frozen=True, slots=True)
class Request:
    """What routing looks at: the method and the raw path (query removed, never decoded)."""

    method: str
    path: str


@dataclass(frozen=True, slots=True)
class Fetch:
    """A request the server answers with content: the API base, a manifest or a blob."""

    kind: Literal["base", "manifests", "blobs", "signature", "tag"]
    digest: str = ""
    """Manifests and blobs: the digest asked for; signature: the digest its tag signs."""
    name: str = ""
    """A signature's ``<repository>/sha256-<hex>.sig`` (``signatures.served_tags``' key), or
    a tag's ``<repository>/<tag>`` (``tags.tag_names``' key): answered only when listed."""


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """A distribution error response: status, error code, message, extra headers."""

    status: int
    code: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def body(self) -> bytes:
        error = {"code": self.code, "message": self.message, "detail": None}
        return json.dumps({"errors": [error]}).encode()


def route(request: Request) -> Fetch | ErrorAnswer:
    """What ``request`` asks for; any ``<name>`` is accepted, only the digest is looked up."""
    if request.method not in ("GET", "HEAD"):
        return ErrorAnswer(405, "UNSUPPORTED", "read-only registry", {"Allow": "GET, HEAD"})
    if request.path in ("/v2/", "/v2"):
        return Fetch("base")
    match = _ROUTE.match(request.path)
    if match is None:
        return ErrorAnswer(404, "UNSUPPORTED", "no such endpoint")
    if not is_repository_name(match["name"]):
        return ErrorAnswer(400, "NAME_INVALID", "invalid repository name")
    return _by_reference(match["kind"], match["ref"], match["name"])


def _by_reference(kind: str, ref: str, name: str) -> Fetch | ErrorAnswer:
    """A digest, or for a manifest a signature's tag or any other tag: looked up by name."""
    signed = tag_digest(ref) if kind == "manifests" else None
    if signed is not None:
        return Fetch("signature", signed, f"{name}/{ref}")
    if kind == "manifests" and is_tag(ref):
        return Fetch("tag", name=f"{name}/{ref}")
    if _DIGEST.match(ref):
        return Fetch("manifests" if kind == "manifests" else "blobs", ref)
    if kind == "manifests" and ":" not in ref:
        return ErrorAnswer(404, "MANIFEST_UNKNOWN", "no such tag")
    return ErrorAnswer(400, "DIGEST_INVALID", "only sha256 digests (and signed tags) are served")


def parse_range(header: str | None, size_bytes: int) -> tuple[int, int] | None:
    """``(start, end_exclusive)`` of a single byte range; None means the whole blob.

    RFC 9110, section 14.2: a server MAY ignore ``Range``, and does here for anything but one
    ``bytes=`` range of at most ``MAX_RANGE_DIGITS`` digits a side (several ranges, another
    unit, a longer value, a malformed one): the whole blob is sent. A range that starts at or
    past the end raises ``RangeNotSatisfiable`` (416). Linear in the header, never more than
    ``MAX_RANGE_HEADER_CHARS`` looked at; no number longer than 19 digits is ever converted.
    """
    text = header.strip(" \t") if header and len(header) <= MAX_RANGE_HEADER_CHARS else ""
    match = _RANGE.fullmatch(text)
    if match is None or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if not first:
        if int(last) == 0:
            raise RangeNotSatisfiable(header)
        return max(0, size_bytes - int(last)), size_bytes
    start = int(first)
    if last and int(last) < start:
        return None
    if start >= size_bytes:
        raise RangeNotSatisfiable(header)
    return start, min(int(last) + 1, size_bytes) if last else size_bytes


def content_range(size_bytes: int, span: tuple[int, int] | None) -> dict[str, str]:
    """The ``Content-Range`` of a 206 (``span``) or of a 416 (None)."""
    if span is None:
        return {"Content-Range": f"bytes */{size_bytes}"}
    return {"Content-Range": f"bytes {span[0]}-{span[1] - 1}/{size_bytes}"}


def _json_object(body: bytes) -> dict[str, object] | None:
    if count_values(body) > MAX_DOCUMENT_VALUES:
        return None
    try:
        doc = loads_json(body, what="manifest", max_bytes=len(body), max_depth=MANIFEST_DEPTH)
    except MalformedInput:
        return None
    return doc if isinstance(doc, dict) else None


def manifest_media_type(body: bytes) -> str | None:
    """The media type of a manifest body, or None when the blob is not a manifest."""
    doc = _json_object(body)
    if doc is None:
        return None
    media_type = doc.get("mediaType")
    if isinstance(media_type, str) and media_type:
        return media_type
    if isinstance(doc.get("manifests"), list):
        return MEDIA_TYPE_OCI_INDEX
    if "config" in doc and "layers" in doc:
        return MEDIA_TYPE_OCI_MANIFEST
    return None
