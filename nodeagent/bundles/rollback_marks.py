"""The anti-rollback marks a node keeps beside the signed manifests of its store (pure).

The marks are derived from the signed manifests the store keeps (``bundles.freshness``,
docs/decisions/0040-anti-rollback.md). A manifest that stops verifying (its key was removed
from ``trusted-keys.d``, its bytes were damaged) would drop out of that derivation and take
its mark with it; so every stamp that ever held a mark is also recorded in
``rollback-marks.json`` at the store's root, and the marks are the union of both. This module
says what that file holds and reads it strictly; ``adapters.store.accepted`` writes it
atomically, sets a damaged one aside and rebuilds it from the stored manifests.

Only what the rule needs is kept (``compact``): per key and channel the stamps at the highest
sequence (a re-import of the same manifest is recognised), per key the stamp of the highest
format, and every stamp that declares ``supersedes`` (the links between keys). So the file
grows with keys and channels, not with bundles.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from nodeagent.bundles.freshness import (
    MAX_SEQUENCE,
    MAX_SUPERSEDED,
    Stamp,
    format_mark,
    freshness_of,
    high_water,
    is_key_id,
    supersedes_of,
)
from nodeagent.bundles.manifest import is_bundle_id, is_manifest_digest
from nodeagent.errors import BundleManifestInvalid, StateFileDamaged
from nodeagent.strict import MalformedInput, clip, loads_json

MARKS_VERSION: Final = 1
MAX_MARKS_BYTES: Final = 4 << 20
"""About 15,000 stamps of 250 bytes: far more keys and channels than a site has."""
MAX_MARKS: Final = 10_000
_FIELDS: Final = frozenset(
    {"keyId", "channel", "sequence", "manifestDigest", "bundleId", "formatVersion", "supersedes"}
)
_FORMATS: Final = frozenset({1, 2, 3})


def compact(stamps: Iterable[Stamp]) -> tuple[Stamp, ...]:
    """The stamps the rule needs (see the module docstring), sorted, each once."""
    lines: dict[tuple[str, str], list[Stamp]] = {}
    by_key: dict[str, list[Stamp]] = {}
    kept: set[Stamp] = set()
    for s in set(stamps):
        lines.setdefault((s.key_id, s.channel), []).append(s)
        by_key.setdefault(s.key_id, []).append(s)
        if s.supersedes:
            kept.add(s)
    for (key_id, channel), line in lines.items():
        mark = high_water(line, key_id, channel)
        kept |= {s for s in line if mark is not None and s.sequence == mark.sequence}
    for key_id, signed in by_key.items():
        top = format_mark(signed, frozenset({key_id}))
        kept |= {top} if top is not None else set()
    return tuple(sorted(kept, key=_order))


def _order(s: Stamp) -> tuple[str, str, int, str, str]:
    return (s.key_id, s.channel, s.sequence, s.manifest_digest, s.bundle_id)


def marks_to_json(stamps: Iterable[Stamp]) -> bytes:
    """The file's bytes: stable for the same stamps, so an unchanged file is not rewritten."""
    doc = {"version": MARKS_VERSION, "stamps": [_stamp_doc(s) for s in compact(stamps)]}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def _stamp_doc(s: Stamp) -> dict[str, Any]:
    return {
        "keyId": s.key_id,
        "channel": s.channel,
        "sequence": s.sequence,
        "manifestDigest": s.manifest_digest,
        "bundleId": s.bundle_id,
        "formatVersion": s.format_version,
        "supersedes": list(s.supersedes),
    }


def marks_from_json(data: bytes, *, where: str) -> tuple[Stamp, ...]:
    """The stamps of a marks file; ``StateFileDamaged`` (naming ``where`` and the field)
    when it is not one nodeagent wrote."""
    try:
        doc = loads_json(data, what=where, max_bytes=MAX_MARKS_BYTES, max_depth=4)
    except MalformedInput as err:
        raise StateFileDamaged(str(err)) from None
    if not isinstance(doc, dict) or doc.get("version") != MARKS_VERSION:
        raise StateFileDamaged(f"{where}: not a version {MARKS_VERSION} marks file")
    items = doc.get("stamps")
    if not isinstance(items, list) or len(items) > MAX_MARKS:
        raise StateFileDamaged(f"{where}: stamps must be a list of at most {MAX_MARKS}")
    return tuple(_stamp(item, f"{where} stamps[{index}]") for index, item in enumerate(items))


def _stamp(item: object, where: str) -> Stamp:
    if not isinstance(item, dict) or set(item) != _FIELDS:
        raise StateFileDamaged(f"{where}: must hold exactly {', '.join(sorted(_FIELDS))}")
    _check(item, where)
    try:
        links = item["supersedes"]
        supersedes = supersedes_of(links, limit=MAX_SUPERSEDED + 1) if links else ()
    except BundleManifestInvalid as err:
        raise StateFileDamaged(f"{where}: {err.message}") from None
    return Stamp(
        item["keyId"],
        item["channel"],
        item["sequence"],
        item["manifestDigest"],
        item["bundleId"],
        format_version=item["formatVersion"],
        supersedes=supersedes,
    )


def _check(item: Mapping[str, Any], where: str) -> None:
    checks = {
        "keyId": is_key_id(item["keyId"]),
        "channel": _is_channel(item["channel"]),
        "sequence": type(item["sequence"]) is int and 0 <= item["sequence"] <= MAX_SEQUENCE,
        "manifestDigest": is_manifest_digest(item["manifestDigest"]),
        "bundleId": is_bundle_id(item["bundleId"]),
        "formatVersion": type(item["formatVersion"]) is int and item["formatVersion"] in _FORMATS,
        "supersedes": isinstance(item["supersedes"], list),
    }
    bad = [name for name, is_good in checks.items() if not is_good]
    if bad:
        raise StateFileDamaged(f"{where}: {bad[0]} {clip(item[bad[0]], 80)} is not valid")


def _is_channel(text: object) -> bool:
    try:
        return freshness_of({"channel": text}, "1970-01-01T00:00:00Z").channel == text
    except BundleManifestInvalid:
        return False
