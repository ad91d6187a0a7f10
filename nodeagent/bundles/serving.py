"""Pulling images from blobs nodeagent serves itself: a bundle's, or the node's store's.

The runtime pulls each image by its original name; a registries.conf mirror drop-in
points those repositories at the loopback server for the duration, so the runtime's own
digest checks apply and the images are stored under their real names. One session at a
time (``MIRROR_LOCK``): the importer and the restorer share the one drop-in file.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from nodeagent.bundles.manifest import BundleError
from nodeagent.bundles.mirror import PROBE_REF, PROBE_REPOSITORY, mirror_repositories
from nodeagent.bundles.signatures import AttachmentScopes
from nodeagent.bundles.tags import ServedTag
from nodeagent.errors import NodeAgentError, RegistryUnavailable
from nodeagent.ports import ImageRuntime, Reloader
from nodeagent.prepull import Held, PrePuller, PullResult
from nodeagent.references import PinnedImageRef

log = structlog.get_logger(__name__)

MIRROR_SETTLE_S = 30.0
"""How long the first pull waits for the runtime to apply the mirror after the reload."""
PULL_DEADLINE_S = 24 * 3600.0
"""Backstop deadline of one pull from a local source (no stall detector)."""
MIRROR_LOCK = asyncio.Lock()
"""Held for a whole session: one mirror drop-in, one server behind it."""


class BundleServerPort(Protocol):
    @property
    def mirror_host(self) -> str: ...

    @property
    def rejections(self) -> tuple[BundleError, ...]: ...

    def bytes_served(self) -> int: ...

    def requests_seen(self) -> int: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class SigstorePort(Protocol):
    """The runtime's registries.d (``adapters.bundles.registries_d.RegistriesD``)."""

    @property
    def directory(self) -> str: ...

    def scopes(self) -> AttachmentScopes: ...

    def write_mirror(self, mirror_host: str) -> bool: ...

    def remove_mirror(self) -> bool: ...


@contextlib.asynccontextmanager
async def reading_signatures(
    sigstore: SigstorePort | None, mirror_host: str
) -> AsyncIterator[None]:
    """For the session, make the runtime read sigstore attachments from the loopback mirror
    (registries.d decides per reference pulled from: docs/runtime-facts.md#sigstore-signatures).
    A registries.d nodeagent cannot write is logged and the session goes on: a runtime whose
    policy needs the signatures then refuses the images with its own reason."""
    if sigstore is None:
        yield
        return
    try:
        await asyncio.to_thread(sigstore.write_mirror, mirror_host)
    except NodeAgentError as exc:
        log.warning("mirror_signatures_not_enabled", reason=exc.reason, error=exc.message)
    try:
        yield
    finally:
        try:
            await asyncio.to_thread(sigstore.remove_mirror)
        except NodeAgentError as exc:
            log.error("mirror_signatures_not_removed", reason=exc.reason, error=exc.message)


class MirrorPort(Protocol):
    def write(
        self, repositories: Iterable[str], mirror_host: str, *, tagged: Iterable[str] = ()
    ) -> bool: ...

    def remove(self) -> bool: ...


@dataclass
class MirrorPullPorts:
    runtime: ImageRuntime
    mirror: MirrorPort
    reloader: Reloader
    make_puller: Callable[[], PrePuller]
    is_probing: bool = False
    """Pull nothing before a probe pull (``mirror.PROBE_REF``) reached the server: a pull
    the runtime starts before it applied the mirror goes to the image's own registry (the
    daemon's wiring: True; service tests without a runtime that follows the mirror: False)."""


async def pull_via_mirror(
    ports: MirrorPullPorts,
    server: BundleServerPort,
    images: Iterable[PinnedImageRef],
    missing: Sequence[str],
    *,
    source: str,
    tags: Sequence[ServedTag] = (),
    ready: Callable[[str], Awaitable[Held | None]] | None = None,
) -> Mapping[str, PullResult]:
    """Pull ``missing`` through a mirror of ``images``' repositories at the started
    ``server``; the mirror is removed (and the runtime reloaded) whatever happens.
    ``ready`` (an import whose store copy runs: ``bundles.arrivals``): an image is pulled
    only once it says so, the first of them alone first; one it holds back is not pulled.
    ``tags``: the tags the server answers (``bundles.tags``): their repositories' entries
    also send pulls by tag to the server, and each tag is pulled once the images are in
    (``pull_served_tags``), so the runtime knows the image by its tag too.

    ``missing`` is looked at again first: the session that held the lock before (a bundle
    import, a restore) may have brought some of them back meanwhile.
    """
    try:
        missing = [ref for ref in missing if await ports.runtime.image_status(ref) is None]
        if not missing:
            return {}
        repositories = mirror_repositories(images)
        tagged = mirror_repositories(t.image for t in tags)
        ports.mirror.write(
            [*repositories, PROBE_REPOSITORY] if ports.is_probing else repositories,
            server.mirror_host,
            **({"tagged": tagged} if tagged else {}),
        )
        await ports.reloader.reload()
        if ports.is_probing:
            await _await_mirror(ports.runtime, server)
        leader, held = (missing[0], None) if ready is None else await _first_ready(missing, ready)
        if held is not None:
            return {ref: PullResult(ref, False, 0, 0.0, held.reason, held.message)
                    for ref in missing}  # fmt: skip
        first = await _first_pull(ports.runtime, leader, server, source)
        rest = [ref for ref in missing if ref not in first]
        if server.rejections:  # a blob failed its digest: stop
            rest = []
        results = first | dict(await ports.make_puller().pull_all(rest, ready=ready))
        if not server.rejections:
            failed = {ref for ref, result in results.items() if not result.is_pulled}
            kept = [tag for tag in tags if str(tag.image) not in failed]
            await pull_served_tags(ports.runtime, kept, source)
        return results
    finally:
        try:
            if ports.mirror.remove():
                await ports.reloader.reload()
        finally:
            await server.close()


async def pull_served_tags(runtime: ImageRuntime, tags: Sequence[ServedTag], source: str) -> int:
    """Pull each served tag (``host/repo:tag``) through the mirror, now that its image is
    in: the runtime fetches only the manifest and records the tag, so a pod naming the tag
    finds it offline. A failure is logged and left for the next pull (the image itself is
    in by digest); returns the tags pulled."""
    pulled = 0
    for tag in tags:
        try:
            await runtime.pull_image(tag.reference, None, timeout_s=MIRROR_SETTLE_S)
        except NodeAgentError as err:
            log.warning("served_tag_not_pulled", tag=tag.reference, source=source,
                        reason=err.reason, error=str(err))  # fmt: skip
            continue
        pulled += 1
        log.info("served_tag_pulled", tag=tag.reference, digest=tag.image.digest, source=source)
    return pulled


async def _await_mirror(runtime: ImageRuntime, server: BundleServerPort) -> bool:
    """Whether the runtime applied the mirror within ``MIRROR_SETTLE_S``: the probe image's
    pull reaches the server only through the mirror (the server answers 404; the runtime then
    tries the probe's own registry, a loopback port nothing listens on, and fails). Tried
    every 0.1-1 s; on a timeout the first pull's own retries take over."""
    started = time.monotonic()
    delay_s = 0.1
    while True:
        with contextlib.suppress(NodeAgentError):  # the expected outcome: found nowhere
            await runtime.pull_image(PROBE_REF, None, timeout_s=MIRROR_SETTLE_S)
        if server.requests_seen() > 0:
            log.debug("mirror_applied", seconds=round(time.monotonic() - started, 3))
            return True
        if server.rejections:  # the server failed (its process ended): stop at once
            return False
        if time.monotonic() - started >= MIRROR_SETTLE_S:
            log.warning("mirror_not_confirmed", seconds=MIRROR_SETTLE_S)
            return False
        await asyncio.sleep(delay_s)
        delay_s = min(delay_s * 2, 1.0)


async def _first_ready(
    refs: Sequence[str], ready: Callable[[str], Awaitable[Held | None]]
) -> tuple[str, Held | None]:
    """The first of ``refs`` ``ready`` lets start (the earliest listed among those that are
    at once); when it holds back every one, the last reason it gave."""
    waits: dict[asyncio.Future[Held | None], int] = {
        asyncio.ensure_future(ready(ref)): index for index, ref in enumerate(refs)
    }
    pending: set[asyncio.Future[Held | None]] = set(waits)
    held: Held | None = None
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for wait in sorted(done, key=waits.__getitem__):
                answer = wait.result()
                if answer is None:
                    return refs[waits[wait]], None
                held = answer
        return refs[0], held
    finally:
        for wait in pending:
            wait.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _first_pull(
    runtime: ImageRuntime, ref: str, server: BundleServerPort, source: str
) -> dict[str, PullResult]:
    """Pull one image alone, retrying quickly while the runtime has not applied the mirror.

    A reload is a signal: it returns before the runtime has re-read registries.conf, and
    a pull started too early goes to the image's own registry, which may not be there.
    That fails fast (RegistryUnavailable); retry every 0.1-1 s for up to MIRROR_SETTLE_S,
    unless the server refused a blob meanwhile (the runtime then falls back to the
    image's registry, and that failure is no sign of an unapplied mirror).
    """
    started = time.monotonic()
    delay_s = 0.1
    while True:
        try:
            await runtime.pull_image(ref, None, timeout_s=PULL_DEADLINE_S)
        except RegistryUnavailable:
            if server.rejections or time.monotonic() - started >= MIRROR_SETTLE_S:
                return {}
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 1.0)
            continue
        except NodeAgentError:
            return {}  # the pre-puller tries it again and reports the reason
        seconds = time.monotonic() - started
        log.info("image_pulled", image=ref, attempts=1, seconds=round(seconds, 1), source=source)
        return {ref: PullResult(ref, True, 1, seconds)}
