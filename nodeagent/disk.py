"""Disk admission: will the images fit, with the reserve still free, before the first pull?

needed = (compressed bytes of every layer not already stored) x expansion factor;
it is admitted when ``available - needed >= reserve``. Layers shared between
images count once; layers of images the runtime already has count zero. The
runtime reports usage but never capacity (CRI ``ImageFsInfo``), so free space
comes from statvfs on the image filesystem's mountpoint.

An image whose size cannot be learned (no manifest from the registry and none in
the manifest cache) never counts as zero: its set is held (``SizeUnknown``), not
pulled, until the size is known. Every decision is logged with its inputs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from nodeagent.errors import NodeAgentError
from nodeagent.metrics import NO_METRICS, Metrics
from nodeagent.ports import FilesystemSpace, ImageRuntime, RegistryCredentials, SpaceProbe
from nodeagent.status import DiskStatus, ImageFailure
from nodeagent.units import format_bytes

log = structlog.get_logger(__name__)

MANIFEST_FETCHES_AT_ONCE = 8
"""Manifest requests in flight during disk admission. Each costs a round trip or two to
the registry: one after another, 50 images 50 ms away took 5 s before the first pull."""


@dataclass(frozen=True, slots=True)
class ImageLayers:
    """An image's blobs as its registry manifest lists them (compressed sizes)."""

    ref: str
    manifest_digest: str
    config_size_bytes: int
    layers: tuple[tuple[str, int], ...]
    """(digest, compressed size) of each layer, in manifest order."""

    @property
    def total_size_bytes(self) -> int:
        return self.config_size_bytes + sum(size for _, size in self.layers)


@dataclass(frozen=True, slots=True)
class DiskPolicy:
    """How admission sizes a pull against the image filesystem (``[disk]`` in the config)."""

    expansion_factor: float = 2.0
    reserve_bytes: int = 2 * 1024**3
    reserve_percent: float = 0.0


@dataclass(frozen=True, slots=True)
class Admission:
    is_admitted: bool
    needed_bytes: int
    available_bytes: int
    reserve_bytes: int

    def describe(self) -> str:
        """One sentence a technician can act on."""
        figures = (
            f"needs {format_bytes(self.needed_bytes)}, "
            f"{format_bytes(self.available_bytes)} available on the image filesystem, "
            f"{format_bytes(self.reserve_bytes)} must stay free"
        )
        if self.is_admitted:
            return f"fits: {figures}"
        short = self.needed_bytes + self.reserve_bytes - self.available_bytes
        return f"not enough disk space: {figures}; free at least {format_bytes(short)} more"


def reserve_for(total_bytes: int, reserve_bytes: int, reserve_percent: float) -> int:
    """The space that must stay free: the larger of the absolute and the relative reserve."""
    return max(reserve_bytes, int(total_bytes * reserve_percent / 100))


def unique_missing_bytes(
    missing: Iterable[ImageLayers], present_digests: Iterable[str] = ()
) -> int:
    """Compressed bytes of every distinct blob of ``missing`` that is not already stored.

    Layers count once however many images share them. The config blob counts
    once per image (manifest digest): two references to the same image, e.g.
    one image listed by two sets, are stored once.
    """
    seen = set(present_digests)
    total = 0
    for image in missing:
        for digest, size in image.layers:
            if digest not in seen:
                seen.add(digest)
                total += size
        config_key = f"config of {image.manifest_digest or image.ref}"
        if config_key not in seen:
            seen.add(config_key)
            total += image.config_size_bytes
    return total


def needed_bytes(compressed_bytes: int, expansion_factor: float) -> int:
    return int(compressed_bytes * expansion_factor)


def admit(needed: int, space: FilesystemSpace, reserve_bytes: int) -> Admission:
    return Admission(
        is_admitted=space.available_bytes - needed >= reserve_bytes,
        needed_bytes=needed,
        available_bytes=space.available_bytes,
        reserve_bytes=reserve_bytes,
    )


def present_digests(layers: Iterable[ImageLayers]) -> set[str]:
    """Layer digests of images the runtime already stores."""
    return {digest for image in layers for digest, _ in image.layers}


@dataclass(frozen=True, slots=True)
class SetAdmission:
    admitted: tuple[str, ...]
    refused: tuple[str, ...]
    total: Admission
    """The admission of everything that was asked for (what the message reports)."""


def admit_sets(
    missing_by_set: Mapping[str, Sequence[ImageLayers]],
    present: Iterable[str],
    space: FilesystemSpace,
    reserve_bytes: int,
    expansion_factor: float,
) -> SetAdmission:
    """Admit sets one by one in name order while they fit; refuse the rest.

    Everything is counted across sets (a layer two sets share counts once), so
    admitting set B after set A never double-books space A already claimed.
    """
    stored = set(present)
    everything = [image for name in sorted(missing_by_set) for image in missing_by_set[name]]
    total = admit(
        needed_bytes(unique_missing_bytes(everything, stored), expansion_factor),
        space,
        reserve_bytes,
    )
    admitted: list[str] = []
    refused: list[str] = []
    claimed: list[ImageLayers] = []
    for name in sorted(missing_by_set):
        trial = [*claimed, *missing_by_set[name]]
        need = needed_bytes(unique_missing_bytes(trial, stored), expansion_factor)
        if admit(need, space, reserve_bytes).is_admitted:
            admitted.append(name)
            claimed = trial
        else:
            refused.append(name)
    return SetAdmission(tuple(admitted), tuple(refused), total)


def new_blobs(image: ImageLayers, stored: set[str]) -> tuple[tuple[str, int], ...]:
    """(digest, compressed size) of the blobs a pull of ``image`` fetches: its config and the
    layers the runtime does not hold yet."""
    config = (f"{image.manifest_digest}#config", image.config_size_bytes)
    return (config, *((d, size) for d, size in image.layers if d not in stored))


# ---------------------------------------------------------------- service
class ManifestSource(Protocol):
    """Image manifests from the registry (``adapters.registry.client.RegistryClient``)."""

    async def image_layers(
        self, ref: str, credentials: RegistryCredentials | None
    ) -> ImageLayers: ...


@dataclass
class AdmissionVerdict:
    """What admission decided for one sync, with what it learned on the way."""

    admitted: list[str]
    refused: dict[str, str] = field(default_factory=dict)
    """Refused sets with the sentence that says why."""
    disk: DiskStatus | None = None
    to_pull: dict[str, int] = field(default_factory=dict)
    """Per set, compressed bytes still to download."""
    layers: dict[str, ImageLayers] = field(default_factory=dict)
    """Manifests of the images to pull."""
    stored_layers: set[str] = field(default_factory=set)
    """Layer digests of images the runtime already has."""
    unsized: dict[str, str] = field(default_factory=dict)
    """Sets held because an image's size is unknown, with the sentence that says why."""
    unknown: dict[str, ImageFailure] = field(default_factory=dict)
    """Per image whose size is unknown, why its manifest could not be read."""


def unsized_message(refs: Sequence[str], unknown: Mapping[str, ImageFailure]) -> str:
    """Why a set is held: how many sizes are unknown, and the first image's cause."""
    first = unknown[refs[0]]
    return (
        f"the size of {len(refs)} image(s) is unknown, so they are not pulled (an unknown "
        f"size never counts as zero); first {first.ref}: {first.reason}: {first.message}"
    )


class DiskAdmission:
    """Sizes the missing images from their manifests and admits sets that fit the disk."""

    def __init__(
        self,
        *,
        runtime: ImageRuntime,
        manifests: ManifestSource,
        space: SpaceProbe,
        credentials_for: Callable[[str], RegistryCredentials | None],
        policy: DiskPolicy,
        on_sync: Callable[[], None] = lambda: None,
        metrics: Metrics = NO_METRICS,
        on_sized: Callable[[Mapping[str, Sequence[tuple[str, int]]]], None] | None = None,
    ) -> None:
        """``on_sync`` is called as each sync's admission starts (the registry client forgets
        which hosts it could not reach then: a failure is remembered for one sync).
        ``metrics`` is told each decision; ``on_sized`` (default: ``metrics``) the blobs each
        admitted image will fetch (the daemon's reporter, which tells the metrics too)."""
        self.on_sync = on_sync
        self.metrics = metrics
        self.on_sized = on_sized or metrics.pulls_sized
        self.runtime = runtime
        self.manifests = manifests
        self.space = space
        self.credentials_for = credentials_for
        self.policy = policy

    async def admit(
        self, missing: Mapping[str, Sequence[str]], stored_refs: Iterable[str]
    ) -> AdmissionVerdict:
        """Admit sets (name -> missing refs) greedily in name order; refuse the rest.

        A set with an image of unknown size is held (``AdmissionVerdict.unsized``).
        """
        self.on_sync()
        wanted = {r for refs in missing.values() for r in refs}
        layers, unknown = await self._layers(wanted, is_noted=True)
        have, _ = await self._layers(set(stored_refs), is_noted=False)
        space = await self._space()
        policy = self.policy
        reserve = reserve_for(space.total_bytes, policy.reserve_bytes, policy.reserve_percent)
        unsized_refs = {name: [r for r in refs if r in unknown] for name, refs in missing.items()}
        by_set = {
            name: [layers[r] for r in refs]
            for name, refs in missing.items()
            if not unsized_refs[name]
        }
        stored = present_digests(have.values())
        verdict = admit_sets(by_set, stored, space, reserve, policy.expansion_factor)
        claimed = [image for name in verdict.admitted for image in by_set[name]]
        need = needed_bytes(unique_missing_bytes(claimed, stored), policy.expansion_factor)
        result = AdmissionVerdict(
            admitted=list(verdict.admitted),
            disk=DiskStatus(space.mountpoint, space.available_bytes, need, reserve),
            to_pull={name: unique_missing_bytes(images, stored) for name, images in by_set.items()},
            layers=layers,
            stored_layers=stored,
            unsized={n: unsized_message(r, unknown) for n, r in unsized_refs.items() if r},
            unknown=unknown,
        )
        log.info(
            "disk_admission",
            mountpoint=space.mountpoint,
            available_bytes=space.available_bytes,
            total_bytes=space.total_bytes,
            reserve_bytes=reserve,
            expansion_factor=policy.expansion_factor,
            to_pull_bytes=result.to_pull,
            unsized=sorted(result.unsized),
            admitted=result.admitted,
            refused=list(verdict.refused),
        )
        self._log_verdict(result, verdict, space, reserve, need)
        self.metrics.admission_decided(
            result.admitted, list(verdict.refused), sorted(result.unsized)
        )
        self.on_sized({image.ref: new_blobs(image, stored) for image in claimed})
        return result

    async def _space(self) -> FilesystemSpace:
        filesystems = await self.runtime.image_fs_info()
        mountpoint = filesystems[0].mountpoint if filesystems else "/"
        return await asyncio.to_thread(self.space.space, mountpoint)

    def _log_verdict(
        self,
        result: AdmissionVerdict,
        verdict: SetAdmission,
        space: FilesystemSpace,
        reserve: int,
        need: int,
    ) -> None:
        for name, message in sorted(result.unsized.items()):
            log.warning("disk_size_unknown", set=name, reason="SizeUnknown", error=message)
        if verdict.refused:
            message = verdict.total.describe()
            log.error(
                "disk_refused",
                sets=list(verdict.refused),
                error=message,
                needed_bytes=verdict.total.needed_bytes,
                available_bytes=space.available_bytes,
                reserve_bytes=reserve,
            )
            result.refused = dict.fromkeys(verdict.refused, message)
        elif verdict.admitted:
            log.info(
                "disk_admitted",
                needed=format_bytes(need),
                available=format_bytes(space.available_bytes),
                reserve=format_bytes(reserve),
                needed_bytes=need,
            )

    async def _layers(
        self, refs: Iterable[str], *, is_noted: bool
    ) -> tuple[dict[str, ImageLayers], dict[str, ImageFailure]]:
        """Manifest sizes per ref, and why each other ref has none (logged when ``is_noted``)."""
        slots = asyncio.Semaphore(MANIFEST_FETCHES_AT_ONCE)

        async def fetch(ref: str) -> ImageLayers | ImageFailure:
            async with slots:
                try:
                    return await self.manifests.image_layers(ref, self.credentials_for(ref))
                except NodeAgentError as exc:
                    if is_noted:
                        log.warning(
                            "manifest_unavailable", image=ref, reason=exc.reason, error=exc.message
                        )
                    return ImageFailure(ref, exc.reason, exc.message)

        ordered = sorted(refs)
        fetched = await asyncio.gather(*(fetch(ref) for ref in ordered))
        pairs = list(zip(ordered, fetched, strict=True))
        known = {ref: found for ref, found in pairs if isinstance(found, ImageLayers)}
        unknown = {ref: found for ref, found in pairs if isinstance(found, ImageFailure)}
        return known, unknown
