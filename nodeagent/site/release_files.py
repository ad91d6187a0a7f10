"""A release bundle's signature files, fetched from peers after its blobs (docs/site.md,
"Fetch"): pure checks and the fetch over ``transfer.PeerClientPort``.

A release bundle (``bundles.release``) carries the release's signatures as files beside
``bundle.json`` (``release-signatures/sha256-<hex>-<n>``), each listed with its size and
sha256 in the signed manifest's ``files[]`` and at most ``release.MAX_SIGNATURE_BYTES``
(rule R32). The peer server serves only the names a verified stored manifest lists; the
fetcher asks for exactly those, after the manifest verified, reads at most the listed
size (plus one byte, to tell a longer answer), and keeps a file only when its size and
sha256 match. A peer that fails or sends other bytes is dropped for the rest of the
bundle (``bundle_fetch_peer_dropped``) and the next one asked; none left:
``BundleFetchFailed`` (``NoPeerLeft``), nothing is stored and the fetch is tried again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import structlog

from nodeagent.bundles.manifest import BundleManifest, ExpectedFile
from nodeagent.bundles.release import MAX_SIGNATURE_BYTES
from nodeagent.errors import BundleFetchFailed, NodeAgentError, PeerAnswerInvalid
from nodeagent.site.transfer import MESSAGE_CHARS, PeerClientPort
from nodeagent.strict import clip

log = structlog.get_logger(__name__)


def release_files(manifest: BundleManifest) -> tuple[ExpectedFile, ...]:
    """The signature files of a release bundle, as ``files[]`` lists them (none otherwise)."""
    if manifest.release is None:
        return ()
    listed = {f.path: f for f in manifest.files}
    return tuple(listed[s.path] for s in manifest.release.signatures if s.path in listed)


def checked(expected: ExpectedFile, data: bytes, *, source: str) -> bytes:
    """``data`` when it is the listed file (size, sha256, the 64 KiB bound), else
    ``PeerAnswerInvalid`` naming ``source``."""
    if expected.size_bytes > MAX_SIGNATURE_BYTES or len(data) != expected.size_bytes:
        raise PeerAnswerInvalid(
            f"{source} sent {len(data)} bytes for {expected.path}, bundle.json lists "
            f"{expected.size_bytes} (at most {MAX_SIGNATURE_BYTES})"
        )
    if hashlib.sha256(data).hexdigest() != expected.sha256_hex:
        raise PeerAnswerInvalid(
            f"{source} sent {expected.path} with another sha256 than bundle.json lists"
        )
    return data


def checked_all(manifest: BundleManifest, files: Mapping[str, bytes]) -> dict[str, bytes]:
    """Every release signature file of ``manifest``, each checked; nothing else."""
    wanted = release_files(manifest)
    if set(files) != {f.path for f in wanted}:
        raise PeerAnswerInvalid(f"bundle {manifest.bundle_id}: not its release signatures")
    return {f.path: checked(f, files[f.path], source="the fetch") for f in wanted}


async def fetch_release_files(
    client: PeerClientPort, manifest: BundleManifest, peers: Sequence[str]
) -> dict[str, bytes]:
    """Each release signature file of ``manifest`` from the first of ``peers`` that sends it
    right; a peer that does not is not asked again for this bundle."""
    found: dict[str, bytes] = {}
    left = list(peers)
    for expected in release_files(manifest):
        while expected.path not in found:
            if not left:
                raise BundleFetchFailed(
                    f"bundle {manifest.bundle_id}: no peer left that sends {expected.path}"
                )
            address = left[0]
            try:
                data = await client.bundle_file(
                    address, manifest.bundle_id, expected.path, expected.size_bytes
                )
                found[expected.path] = checked(expected, data, source=f"peer {address}")
            except NodeAgentError as err:
                left.pop(0)
                _dropped(manifest.bundle_id, address, err)
    return found


def _dropped(bundle_id: str, address: str, err: NodeAgentError) -> None:
    log.warning(
        "bundle_fetch_peer_dropped",
        bundle=bundle_id,
        peer=address,
        reason=err.reason,
        error=clip(err.message, MESSAGE_CHARS),
    )
