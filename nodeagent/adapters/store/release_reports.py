"""The OpenShift releases the node's store holds, judged against the cluster's version.

``StoredReleaseReports`` (the reporter's ``releases_source``) reads each recorded bundle's
stored ``bundle.json`` (verified when the bundle was accepted; read beneath the store, no link
followed, bounded: ``records.read_bundle_file``) and gives, per bundle that carries a
``release`` (docs/bundle-format.md#release), its version, release image digest and set, with
the upgrade-path verdict against the cluster's version of now (``releases.release_report``).
It reads again only when the store's ``bundles/`` directory changed or the cluster's version
did; an idle node with an empty store loads no manifest code. Overlaps issue 26 item 5's
``adapters.store.releases`` (its ``StoredReleases.held``), which lists the same bundles for
retirement: one should read for both (decision 0065).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog

from nodeagent.errors import NodeAgentError
from nodeagent.releases import MAX_RELEASES, release_report
from nodeagent.status import ReleaseReport
from nodeagent.store import layout

log = structlog.get_logger(__name__)


class StoredReleaseReports:
    def __init__(self, root: Path, cluster_version: Callable[[], str | None]) -> None:
        self.root = root
        self.cluster_version = cluster_version
        self._key: tuple[int, str | None] | None = None
        self._reports: tuple[ReleaseReport, ...] = ()

    def __call__(self) -> tuple[ReleaseReport, ...]:
        bundles = self.root / layout.BUNDLES_DIR
        try:
            changed_ns = bundles.stat().st_mtime_ns
            is_empty = next(bundles.iterdir(), None) is None
        except OSError:
            return ()
        key = (changed_ns, self.cluster_version())
        if key != self._key:
            # an empty store loads no record or manifest code (the idle budget, decision 0069)
            self._reports = () if is_empty else self._read(key[1])
            self._key = key
        return self._reports

    def _read(self, current: str | None) -> tuple[ReleaseReport, ...]:
        from nodeagent.adapters.store.records import StoreRecords, read_bundle_file  # noqa: PLC0415
        from nodeagent.bundles.manifest import parse_manifest  # noqa: PLC0415  (idle budget)

        found: dict[str, ReleaseReport] = {}
        for record in StoreRecords(self.root).load(is_repairing=False).records:
            data = None if record.is_registry else read_bundle_file(
                self.root, record.bundle_id, layout.MANIFEST_NAME
            )  # fmt: skip
            if data is None:
                continue
            try:
                manifest = parse_manifest(data)
            except NodeAgentError as exc:
                log.warning(
                    "stored_manifest_unreadable", bundle=record.bundle_id, reason=exc.reason,
                    error=exc.message,
                )  # fmt: skip
                continue
            carried = manifest.release
            if carried is None or manifest.bundle_id != record.bundle_id:
                continue
            found[carried.image.digest] = release_report(
                carried.version, carried.image.digest, carried.set_name, carried.previous, current
            )
        return tuple(found.values())[-MAX_RELEASES:]
