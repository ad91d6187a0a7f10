"""The end of a bundle import: its PinnedImageSets handed to the spec directories, and the
record of the bundles imported before (``bundles.json`` in the state directory), by which a
bundle whose images are all present is not imported twice."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import structlog
import yaml

from nodeagent.bundles.import_ports import SpecSink
from nodeagent.bundles.manifest import BundleManifest
from nodeagent.errors import StateFileDamaged
from nodeagent.ports import StateStore
from nodeagent.specs import file_stem

log = structlog.get_logger(__name__)


def set_file_name(bundle_id: str, set_name: str) -> str:
    """``bundle-<id>-<set>.yaml``, a long ``<id>-<set>`` hash-suffixed (``specs.file_stem``)
    so that the file and its atomic write's temporary name fit in NAME_MAX."""
    return f"bundle-{file_stem(f'{bundle_id}-{set_name}')}.yaml"


def set_yaml(obj: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(obj), sort_keys=False)


def hand_over(specs: SpecSink, store: StateStore, manifest: BundleManifest) -> list[str]:
    """Write the bundle's sets (the regular sync pins them) and record the bundle as imported;
    the sets' names."""
    names = []
    for item in manifest.sets:
        name = item.name
        path = specs.write_set(
            set_file_name(manifest.bundle_id, name),
            set_yaml(item.object),
            is_persistent=item.is_persistent,
        )
        log.info("bundle_set_applied", bundle=manifest.bundle_id, set=name, file=str(path))
        names.append(name)
    doc = imported_record(store)
    imported = doc.setdefault("imported", {})
    imported[manifest.bundle_id] = {
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "images": [str(i.ref) for i in manifest.images],
        "sets": names,
    }
    store.save("bundles", doc)
    return names


def was_imported(store: StateStore, bundle_id: str) -> bool:
    return bundle_id in imported_record(store).get("imported", {})


def imported_record(store: StateStore) -> dict[str, Any]:
    """``bundles.json``, the bundles imported before; a damaged one is set aside and
    starts anew (a bundle then imports again, which changes nothing it already did)."""
    try:
        doc = _imported_doc(store.load("bundles"))
    except StateFileDamaged as exc:
        moved_to = store.set_aside("bundles")
        log.warning(
            "state_file_damaged",
            file="bundles",
            reason=exc.reason,
            error=exc.message,
            moved_to=moved_to,
        )
        return {}
    return doc


def _imported_doc(doc: dict[str, Any] | None) -> dict[str, Any]:
    """``bundles.json`` as stored, or ``StateFileDamaged`` when its shape is not nodeagent's."""
    doc = doc or {}
    if not isinstance(doc.get("imported", {}), dict):
        raise StateFileDamaged("state file bundles: 'imported' is not an object")
    return doc
