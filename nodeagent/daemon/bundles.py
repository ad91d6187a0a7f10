"""The bundle importer with its adapters (``bundles.build_importer`` loads this on first use).

Apart from ``bundles.py`` so that a daemon that never sees a bundle never loads the
importer, the loopback server, the mirror drop-in and their dependencies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from nodeagent.adapters.bundles.intake import SpecDirs, check_for_import
from nodeagent.adapters.bundles.mirror import MirrorDropin
from nodeagent.adapters.bundles.server import BundleServer
from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.host import StatvfsSpace
from nodeagent.bundles.importer import BundleReport, Importer, ImporterPorts
from nodeagent.bundles.manifest import BundleError, ExpectedFile
from nodeagent.config import Config
from nodeagent.pins import Reloader
from nodeagent.prepull import PrePuller, PullPolicy
from nodeagent.sync import DiskPolicy

log = structlog.get_logger("nodeagent.bundles.imports")

BUNDLE_PULLS_AT_ONCE = 4
"""At most this many of ``pull.concurrency``: a bundle is served on loopback, so its pulls
wait on CPU and disk, never on a network; more in flight only add I/O-wait stalls
(docs/performance.md, bundle import)."""


class ServedBundle:
    """``importer.BundleServerPort`` over the loopback ``BundleServer``."""

    def __init__(self, root: Path, blobs: Mapping[str, ExpectedFile]) -> None:
        self._server = BundleServer(root, blobs)

    @property
    def mirror_host(self) -> str:
        return self._server.mirror_host

    @property
    def rejections(self) -> tuple[BundleError, ...]:
        return self._server.rejections

    def bytes_served(self) -> int:
        return self._server.counters.bytes_served

    async def start(self) -> None:
        await self._server.start()

    async def close(self) -> None:
        await self._server.close()


def _log_pull(event: str, ref: str, fields: dict[str, object]) -> None:
    """Each image's outcome in the journal, as the pre-puller's events say it."""
    if event == "image_pulled":
        log.info(event, image=ref, source="bundle", **fields)
    elif event in ("pull_failed", "pull_retrying"):
        log.warning(event, image=ref, source="bundle", **fields)


def build_importer(
    config: Config,
    cri: CriClient,
    reloader: Reloader,
    *,
    on_report: Callable[[BundleReport], None],
    is_present: Callable[[Path], bool] = lambda root: root.exists(),
) -> Importer:
    pull = config.pull
    policy = PullPolicy(
        concurrency=min(pull.concurrency, BUNDLE_PULLS_AT_ONCE),
        attempts=pull.attempts,
        backoff_initial_s=pull.backoff_initial_s,
        backoff_max_s=pull.backoff_max_s,
        stall_timeout_s=pull.stall_timeout_s,
    )
    transient = config.specs_transient_dirs[0] if config.specs_transient_dirs else None
    ports = ImporterPorts(
        verify=lambda root: check_for_import(root, config.bundles.trusted_keys_dir),
        runtime=cri,
        make_server=ServedBundle,
        mirror=MirrorDropin(config.runtime.registries_dir / config.bundles.mirror_dropin_name),
        reloader=reloader,
        # The mirror is anonymous: no registry credentials go to it.
        make_puller=lambda: PrePuller(cri, lambda _ref: None, policy, on_event=_log_pull),
        space=StatvfsSpace(),
        specs=SpecDirs(config.specs_persistent_dir, transient or config.specs_persistent_dir),
        store=JsonStateStore(config.state.dir),
        is_present_on_media=is_present,
        on_report=on_report,
    )
    disk = DiskPolicy(
        config.disk.expansion_factor, config.disk.reserve_bytes, config.disk.reserve_percent
    )
    return Importer(ports, disk)
