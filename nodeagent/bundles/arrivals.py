"""Which of an import's images may be pulled while its store copy still runs (decision 0081).

An import from a medium pulls its images while the copy into the node's store goes on
(decision 0079). A pull that started before every blob of its image was stored could be
cut short when the copy is refused (a damaged blob, a full disk), and the layers the
runtime had committed by then stay in its storage, named by no image: nothing removes
them. So an image's pull starts only once every blob it needs is stored:

- its manifest (the reference's digest); if that is an index, the entry for the node's
  platform (``select_platform``; every entry when the platform is not known);
- then that manifest's config and layers.

Manifests are read from the store as they arrive (``StoredBlobs.read_manifest``: bounded,
parsed strictly by ``registries.read_manifest``). A blob that is not a manifest the rules
allow, or that the store cannot read, ends the walk there: the pull runs and the runtime
(or the server) says what is wrong. Once the copy
is refused, an image still waiting never starts (``ready`` gives the copy's reason); once
it has ended whole, every image may start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final, Protocol, TypeVar

from nodeagent.errors import NodeAgentError
from nodeagent.prepull import Held
from nodeagent.registries import ManifestIndex, Platform, read_manifest, select_platform

T = TypeVar("T")

MAX_STEPS: Final = 4096
"""Blobs one image's walk may name: an index of every platform plus a deep image stays far
below (a release's largest images have about 80 layers)."""


class StoredBlobs(Protocol):
    """The node's store as the gate reads it (blocking calls, run in a worker thread)."""

    def has_blob(self, digest: str) -> bool: ...

    def read_manifest(self, digest: str) -> bytes | None:
        """A stored blob's bytes if it is small enough to be a manifest, else None."""
        ...


class ArrivalGate:
    """The images of one import whose blobs are all stored, while its copy runs.

    ``stored`` is called on the event loop for each blob the copy stores, ``end`` once the
    copy is over; ``ready`` is awaited by each pull before it starts."""

    def __init__(
        self,
        blobs: StoredBlobs,
        platform: Platform | None,
        *,
        run_blocking: Callable[..., Awaitable[object]] = asyncio.to_thread,
    ) -> None:
        self._blobs = blobs
        self._platform = platform
        self._run_blocking = run_blocking
        self._arrived: set[str] = set()
        self._waiting: dict[str, asyncio.Event] = {}
        self._is_ended = False
        self._held: Held | None = None

    @property
    def arrived(self) -> frozenset[str]:
        """The blobs the copy stored while the gate watched it."""
        return frozenset(self._arrived)

    def stored(self, digest: str) -> None:
        """The copy stored ``digest`` (called on the event loop)."""
        self._arrived.add(digest)
        event = self._waiting.pop(digest, None)
        if event is not None:
            event.set()

    def end(self, refusal: Held | None) -> None:
        """The copy is over: whole (None) or refused (its reason); every waiting pull is
        answered."""
        self._is_ended = True
        self._held = refusal
        for event in self._waiting.values():
            event.set()
        self._waiting.clear()

    async def ready(self, ref: str) -> Held | None:
        """None once every blob ``ref``'s pull needs is stored (or the copy ended whole);
        the copy's refusal when it was refused first."""
        pending = [(ref.rpartition("@")[2], True)]
        steps = 0
        while pending and steps < MAX_STEPS:
            digest, is_manifest = pending.pop()
            steps += 1
            if not await self._has(digest):
                return self._held
            if is_manifest:
                pending.extend(await self._needs(digest, ref))
        return None

    async def _has(self, digest: str) -> bool:
        """Whether ``digest`` is stored, waiting for it while the copy runs; False only once
        the copy was refused without it."""
        while True:
            if digest in self._arrived:
                return True
            event = self._waiting.setdefault(digest, asyncio.Event())
            try:
                is_stored = await self._call(self._blobs.has_blob, digest)
            except NodeAgentError:
                is_stored = True  # the store cannot tell: the pull runs and finds out
            if is_stored:
                self.stored(digest)
                return True
            if self._is_ended:
                self._waiting.pop(digest, None)
                return self._held is None
            await event.wait()

    async def _needs(self, digest: str, ref: str) -> list[tuple[str, bool]]:
        """The blobs a stored manifest names for the node, each with whether it is a
        manifest: an index's entry for its platform (every entry when the platform is
        unknown), an image's config and layers."""
        try:
            body = await self._call(self._blobs.read_manifest, digest)
            if body is None:
                return []
            manifest = read_manifest(body, ref=ref)
        except NodeAgentError:
            return []  # the runtime's pull finds it wrong and says why
        if not manifest.is_index:
            config = [manifest.config.digest] if manifest.config else []
            return [(blob, False) for blob in config + [d.digest for d in manifest.layers]]
        if self._platform is None:
            return [(entry.digest, True) for entry in manifest.manifests]
        index = ManifestIndex(
            tuple((d.digest, d.platform or Platform("", "")) for d in manifest.manifests)
        )
        try:
            return [(select_platform(index, self._platform, ref=ref), True)]
        except NodeAgentError:
            return []  # no image for this node: the runtime's pull says so

    async def _call(self, function: Callable[[str], T], digest: str) -> T:
        return await self._run_blocking(function, digest)  # type: ignore[return-value]
