"""What this node has accepted, read from the signed manifests its store keeps (anti-rollback).

Every ``bundles/<id>/bundle.json`` the store holds with its signature, whether its blobs
are all there, some, or none any more (the keeper removes blobs only, never a signed
manifest: ``adapters.store.keeper``), and whether its record is whole, damaged or not
written yet (a fetch under way: the node decided to take it). Each is verified again
against this node's trusted keys and its freshness fields read; one that no longer
verifies (its key was removed from ``trusted-keys.d``) or cannot be read counts for
nothing, as the bundle itself would not be taken. No state file is read: a state directory
wiped, or a record set aside and rebuilt, cannot lower a high-water mark
(``bundles.freshness``). Measured: 0.44 ms a small manifest, 6.1 ms a release's of 180
images (169 KB), so 100 stored releases cost 0.6 s per import or fetch decision.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from nodeagent.adapters.bundles.tree import load_trusted_keys_dir
from nodeagent.adapters.store.records import read_bundle_file
from nodeagent.bundles import minisign
from nodeagent.bundles.freshness import Stamp, freshness_of
from nodeagent.bundles.manifest import (
    FORMAT_VERSIONS,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_DEPTH,
    BundleFormatUnsupported,
    BundleManifestInvalid,
)
from nodeagent.errors import HostFileError, NodeAgentError
from nodeagent.store import layout
from nodeagent.strict import MalformedInput, loads_json


def stamp_of(data: bytes, signature: bytes, keys: dict[bytes, minisign.PublicKey]) -> Stamp:
    """The stamp of one signed manifest; raises the bundle's error when it does not verify.

    Only the fields the rule needs are read (its signature verified first, strict JSON, a
    known ``formatVersion``, then ``bundleId``, ``created`` and the freshness fields as
    ``parse_manifest`` reads them): a release's manifest of 180 images is read in about half
    the time of a whole parse, and it was parsed whole when it was accepted."""
    verified = minisign.verify(data, signature, keys, is_legacy_allowed=False)
    try:
        doc = loads_json(
            data, what=MANIFEST_NAME, max_bytes=MAX_MANIFEST_BYTES, max_depth=MAX_MANIFEST_DEPTH
        )
    except MalformedInput as exc:
        raise BundleManifestInvalid(str(exc)) from None
    if not isinstance(doc, dict) or doc.get("formatVersion") not in FORMAT_VERSIONS:
        raise BundleFormatUnsupported(f"{MANIFEST_NAME} is not of a format this node reads")
    bundle_id, created = doc.get("bundleId"), doc.get("created")
    if not layout.is_bundle_id(bundle_id) or not isinstance(created, str):
        raise BundleManifestInvalid(f"{MANIFEST_NAME}: no bundleId or created")
    fresh = freshness_of(doc, created)
    return Stamp(
        key_id=verified.key_id_hex,
        channel=fresh.channel,
        sequence=fresh.sequence,
        manifest_digest=f"sha256:{hashlib.sha256(data).hexdigest()}",
        bundle_id=str(bundle_id),
    )


def accepted_stamps(root: Path, trusted_keys_dir: Path) -> tuple[Stamp, ...]:
    """A stamp for every signed manifest in the store at ``root`` that verifies now."""
    directory = root / layout.BUNDLES_DIR
    try:
        names = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    except FileNotFoundError:
        return ()
    except OSError as err:
        raise HostFileError(f"cannot list {directory}: {err.strerror}") from err
    keys = load_trusted_keys_dir(trusted_keys_dir)
    stamps = []
    for name in names:
        data = read_bundle_file(root, name, layout.MANIFEST_NAME)
        signature = read_bundle_file(root, name, layout.SIGNATURE_NAME)
        if data is None or signature is None:
            continue
        try:
            stamp = stamp_of(data, signature, keys)
        except NodeAgentError:
            continue  # not verifiable now: the bundle itself would be refused
        if stamp.bundle_id == name:
            stamps.append(stamp)
    return tuple(stamps)
