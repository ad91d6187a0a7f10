"""What a peer asks the peer server for (docs/site.md, "The peer protocol"): pure routing.

The OCI distribution part is the loopback mirror's (``nodeagent.bundles.mirror.route``)
plus the tags a stored bundle's verified manifest lists (its signature tags,
``sha256-<hex>.sig``, and its served tags, ``bundles.tags``: the only tags served); nodeagent's own
resources live under ``/nodeagent/v1/``. The path is the raw one, never percent-decoded:
a bundle id must match the format's pattern whole (``nodeagent.store.layout``), so
``..``, ``%2e%2e`` or a ``/`` never name a file. A release signature's name must match
``sha256-<hex>-<n>`` whole; the server then serves it only when the bundle's verified
stored manifest lists that very path (``adapters.store.records.read_release_signature``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from nodeagent.bundles.mirror import ErrorAnswer, Request, is_repository_name, route
from nodeagent.bundles.release import SIGNATURES_DIR
from nodeagent.store.layout import MANIFEST_NAME, SIGNATURE_NAMES, is_bundle_id

HOLDINGS_PATH: Final = "/nodeagent/v1/holdings"
_BUNDLE_PATH: Final = re.compile(r"^/nodeagent/v1/bundles/(?P<id>[^/]*)/(?P<file>[^/]*)$")
_RELEASE_SIGNATURE_PATH: Final = re.compile(
    r"^/nodeagent/v1/bundles/(?P<id>[^/]*)/" + SIGNATURES_DIR
    + r"/(?P<name>sha256-[a-f0-9]{64}-[1-9][0-9]{0,3})$"
)  # fmt: skip
_SIGNATURE_TAG: Final = re.compile(
    r"^/v2/(?P<name>.+)/manifests/sha256-(?P<hex>[a-f0-9]{64})\.sig$"
)
BUNDLE_FILES: Final = (MANIFEST_NAME, *SIGNATURE_NAMES)

Kind = Literal[
    "base", "manifests", "blobs", "signature", "tag", "holdings", "bundle-file", "have",
    "release-signature",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class PeerTarget:
    kind: Kind
    digest: str = ""
    """Manifests and blobs: the digest asked for; signature: the digest the tag signs."""
    bundle_id: str = ""
    file: str = ""
    """``bundle.json``, ``bundle.json.minisig`` or ``bundle.json.ecdsa-sig``, for
    ``bundle-file``; for ``release-signature``, ``release-signatures/sha256-<hex>-<n>``."""
    name: str = ""
    """A signature's ``<repository>/sha256-<hex>.sig`` (``signatures.served_tags``' key), or
    a served tag's ``<repository>/<tag>`` (``tags.tag_names``' key)."""


def route_peer(method: str, path: str) -> PeerTarget | ErrorAnswer:
    """What a peer's request asks for, or the error it is answered."""
    if method not in ("GET", "HEAD"):
        return ErrorAnswer(405, "UNSUPPORTED", "read-only server", {"Allow": "GET, HEAD"})
    if path.startswith("/nodeagent/"):
        return _own(path)
    signature = _SIGNATURE_TAG.match(path)
    if signature is not None:
        if not is_repository_name(signature["name"]):
            return ErrorAnswer(400, "NAME_INVALID", "invalid repository name")
        tag = f"{signature['name']}/sha256-{signature['hex']}.sig"
        return PeerTarget("signature", digest=f"sha256:{signature['hex']}", name=tag)
    target = route(Request(method, path))
    if isinstance(target, ErrorAnswer):
        return target
    return PeerTarget(target.kind, digest=target.digest, name=target.name)


def _release_signature(bundle_id: str, name: str) -> PeerTarget | ErrorAnswer:
    if not is_bundle_id(bundle_id):
        return ErrorAnswer(400, "BUNDLE_ID_INVALID", "not a bundle id")
    return PeerTarget("release-signature", bundle_id=bundle_id, file=f"{SIGNATURES_DIR}/{name}")


def _own(path: str) -> PeerTarget | ErrorAnswer:
    if path == HOLDINGS_PATH:
        return PeerTarget("holdings")
    release = _RELEASE_SIGNATURE_PATH.match(path)
    if release is not None:
        return _release_signature(release["id"], release["name"])
    match = _BUNDLE_PATH.match(path)
    if match is None:
        return ErrorAnswer(404, "NOT_FOUND", "no such resource")
    return _bundle_file(match["id"], match["file"])


def _bundle_file(bundle_id: str, file: str) -> PeerTarget | ErrorAnswer:
    if not is_bundle_id(bundle_id):
        return ErrorAnswer(400, "BUNDLE_ID_INVALID", "not a bundle id")
    if file == "have":
        return PeerTarget("have", bundle_id=bundle_id)
    if file in BUNDLE_FILES:
        return PeerTarget("bundle-file", bundle_id=bundle_id, file=file)
    return ErrorAnswer(404, "NOT_FOUND", "no such resource")
