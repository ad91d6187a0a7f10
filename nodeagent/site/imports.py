"""Fetched bundles on their way to the import (docs/site.md, "Fetch", step 7).

``FetchedImports.run`` imports and pins a fetched bundle from the store (the importer's
``import_stored``, as after a stick). One that does not end imported (the runtime down, no
space for the images) is tried again at later looks (``retry_due``), with backoff, said
once. The state document ``fetched-imports`` lists every fetched bundle not imported yet,
so a restart between the record and the import still imports it (``resume``). The
retries are bounded (``MAX_MEMO`` bundles, the one touched longest ago forgotten first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

import structlog

from nodeagent.errors import NodeAgentError
from nodeagent.site.fetching import SignedBundle
from nodeagent.site.standing import Lru
from nodeagent.site.transfer import MESSAGE_CHARS, FetcherPorts
from nodeagent.status import BundleReport
from nodeagent.strict import clip

log = structlog.get_logger("nodeagent.site.fetcher")

PENDING: Final = "fetched-imports"
"""The state document of fetched bundles waiting for their import."""
MAX_MEMO: Final = 4096
"""Bundles (id and digest) remembered: backoffs, imports to retry (a holdings document
lists at most 4096 bundles)."""


def source(bundle_id: str) -> str:
    """The bundle board's key of a fetched bundle."""
    return f"peers:{bundle_id}"


class FetchedImports:
    """Imports of fetched bundles, their retries, and the state file that outlives a restart."""

    def __init__(self, ports: FetcherPorts, backoff_s: Callable[[int], float]) -> None:
        self.ports = ports
        self.backoff_s = backoff_s
        self._retries: Lru[tuple[str, str], tuple[SignedBundle, int, float]] = Lru(MAX_MEMO)
        """(bundle id, digest) → (the bundle, failures, when to try again)."""

    async def resume(self) -> None:
        """Bundles fetched whole whose import a restart cut off: imported now."""
        for bundle_id, digest in sorted(self._pending().items()):
            signed = await asyncio.to_thread(self.ports.store.stored_signed, bundle_id)
            if signed is None or signed.manifest_digest != digest:
                self.set_pending(bundle_id, None)
                continue
            log.info("bundle_import_resumed", bundle=bundle_id)
            await self.run(signed)

    async def retry_due(self) -> None:
        for _key, (signed, _failures, due_s) in self._retries.items():
            if self.ports.clock() >= due_s:
                await self.run(signed)

    def _pending(self) -> dict[str, str]:
        """Bundle id → manifest digest of each fetched bundle not imported yet."""
        if self.ports.state is None:
            return {}
        try:
            doc = self.ports.state.load(PENDING) or {}
        except NodeAgentError as err:
            log.warning("state_file_damaged", file=PENDING, reason=err.reason)
            self.ports.state.set_aside(PENDING)
            return {}
        found = doc.get("bundles")
        if not isinstance(found, dict):
            return {}
        return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}

    def set_pending(self, bundle_id: str, digest: str | None) -> None:
        if self.ports.state is None:
            return
        pending = self._pending()
        if digest is None:
            pending.pop(bundle_id, None)
        else:
            pending[bundle_id] = digest
        try:
            self.ports.state.save(PENDING, {"bundles": pending})
        except NodeAgentError as err:  # a full state disk: the import still runs now
            log.warning("state_not_saved", file=PENDING, reason=err.reason, error=err.message)

    async def run(self, signed: SignedBundle) -> None:
        """Import and pin from the store; one that does not end imported is tried again
        at later looks, with backoff."""
        bundle_id = signed.manifest.bundle_id
        key = (bundle_id, signed.manifest_digest)
        try:
            report = await self.ports.import_bundle(signed, source(bundle_id))
        except NodeAgentError as err:
            message = clip(err.message, MESSAGE_CHARS)
            report = BundleReport(
                source(bundle_id), "rejected", bundle_id=bundle_id, reason=err.reason,
                message=message,
            )  # fmt: skip
            self.ports.report(report)
        if report.state == "imported":
            self._retries.pop(key)
            self.set_pending(bundle_id, None)
            return
        earlier = self._retries.get(key)
        failures = 1 if earlier is None else earlier[1] + 1
        wait_s = self.backoff_s(failures)
        self._retries[key] = (signed, failures, self.ports.clock() + wait_s)
        level = log.warning if failures == 1 else log.debug  # said once, then quietly
        level(
            "bundle_fetched_not_imported",
            bundle=bundle_id,
            state=report.state,
            reason=report.reason,
            retry_in_s=round(wait_s),
        )
