"""In-memory ports the service tests need besides the peers' fakes (crio, clock, reloader).

The sync loop's virtual time (``LoopClock``), a runtime whose ``version`` fails on cue, a
state store, a space probe, registry manifests, a recording ``SyncReport``; for bundles a
verified bundle, the loopback server, the mirror drop-in and the spec directories; for
media a mounter, a udev source fed by the test and an importer the test drives.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.bundles.manifest import BundleError, BundleManifest, ExpectedFile
from nodeagent.bundles.media import MediaEvent
from nodeagent.disk import ImageLayers
from nodeagent.errors import ImageNotFound, NodeAgentError
from nodeagent.ports import FilesystemSpace, RegistryCredentials, RuntimeVersion
from nodeagent.status import BundleReport, BundleState, NodeStatus
from tests.fakes.crio import FakeCrio


# ---------------------------------------------------------------- runtime and state
class FlakyCrio(FakeCrio):
    """``FakeCrio`` whose ``version`` follows a script: an error is raised, None answers.

    Once the script is used up the runtime answers.
    """

    def __init__(
        self, *, version_script: Sequence[NodeAgentError | None] = (), **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.version_script = list(version_script)
        self.version_calls = 0

    async def version(self) -> RuntimeVersion:
        self.version_calls += 1
        step = self.version_script.pop(0) if self.version_script else None
        if step is not None:
            raise step
        return await super().version()


class MemoryStore:
    """``ports.StateStore`` in memory; documents are copied in and out like JSON files."""

    def __init__(self, docs: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.docs: dict[str, dict[str, Any]] = {
            k: copy.deepcopy(v) for k, v in (docs or {}).items()
        }
        self.saves: list[tuple[str, dict[str, Any]]] = []
        """Every document saved, in order (a copy)."""

    def load(self, name: str) -> dict[str, Any] | None:
        doc = self.docs.get(name)
        return None if doc is None else copy.deepcopy(doc)

    def save(self, name: str, obj: dict[str, Any]) -> bool:
        text = json.dumps(obj, sort_keys=True)  # what the real store could not write fails here
        self.saves.append((name, json.loads(text)))
        is_changed = name not in self.docs or json.dumps(self.docs[name], sort_keys=True) != text
        self.docs[name] = json.loads(text)
        return is_changed

    def set_aside(self, name: str) -> str | None:
        """Like ``JsonStateStore.set_aside``: the document moves to a ``.damaged`` name."""
        doc = self.docs.pop(name, None)
        if doc is None:
            return None
        self.docs[f"{name}.damaged"] = doc
        return f"{name}.damaged"


class RecordingLine:
    """``ports.StatusLine``: every ``STATUS=`` line, in order."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def status(self, text: str) -> None:
        self.lines.append(text)


class FixedSpace:
    """``ports.SpaceProbe``: the same figures for any mountpoint; records what was asked."""

    def __init__(self, *, total_bytes: int, available_bytes: int) -> None:
        self.total_bytes = total_bytes
        self.available_bytes = available_bytes
        self.asked: list[str] = []

    def space(self, mountpoint: str) -> FilesystemSpace:
        self.asked.append(mountpoint)
        return FilesystemSpace(mountpoint, self.total_bytes, self.available_bytes)


class FakeManifests:
    """``disk.ManifestSource``: one layer of ``size_bytes`` per image (unknown: ImageNotFound)."""

    def __init__(self, sizes: Mapping[str, int]) -> None:
        self.sizes = dict(sizes)
        self.asked: list[str] = []

    async def image_layers(self, ref: str, credentials: RegistryCredentials | None) -> ImageLayers:
        self.asked.append(ref)
        size = self.sizes.get(ref)
        if size is None:
            raise ImageNotFound(f"{ref}: manifest unknown")
        digest = "sha256:" + hashlib.sha256(ref.encode()).hexdigest()
        layer = "sha256:" + hashlib.sha256(f"layer of {ref}".encode()).hexdigest()
        return ImageLayers(ref, digest, 0, ((layer, size),))


class RecordingReport:
    """``sync.SyncReport`` that records each call with the virtual time it came at."""

    def __init__(self, now: Callable[[], float] = lambda: 0.0) -> None:
        self.now = now
        self.events: list[tuple[str, float]] = []
        self.progress: list[NodeStatus] = []
        self.finished: list[NodeStatus] = []
        self.failures: list[NodeAgentError] = []

    def sync_started(self) -> None:
        self.events.append(("started", self.now()))

    def sync_progress(self, status: NodeStatus) -> None:
        self.events.append(("progress", self.now()))
        self.progress.append(status)

    def sync_finished(self, status: NodeStatus) -> None:
        self.events.append(("finished", self.now()))
        self.finished.append(status)

    def sync_failed(self, error: NodeAgentError) -> None:
        self.events.append(("failed", self.now()))
        self.failures.append(error)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


class LoopClock:
    """``monotonic`` and ``wait(event, timeout_s)`` for ``Reconciler.run`` in virtual time.

    A wait returns at once when the event is already set (a sync was requested), else, in
    ``auto`` mode, after moving the clock by the whole timeout. With ``auto`` off it returns
    when the event is set or the test calls ``elapse``. Every wait is recorded; the
    ``park_after``-th wait never returns (the test then cancels the loop), and
    ``parked`` is set.
    """

    def __init__(self, *, start_s: float = 0.0, park_after: int = 1000, auto: bool = True) -> None:
        self.now_s = start_s
        self.park_after = park_after
        self.auto = auto
        self.waits: list[float] = []
        """The timeout of each wait, in order."""
        self.kicked: list[bool] = []
        """Per wait that returned: whether the event (a request) ended it."""
        self.entered = asyncio.Event()
        self.parked = asyncio.Event()
        self._elapsed = asyncio.Event()
        self._timeout_s = 0.0

    def monotonic(self) -> float:
        return self.now_s

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        self.waits.append(timeout_s)
        if len(self.waits) >= self.park_after:
            self.parked.set()
            await asyncio.Event().wait()
        if event.is_set():
            self.kicked.append(True)
            return
        if self.auto:
            self.now_s += timeout_s
            self.kicked.append(False)
            return
        self._timeout_s = timeout_s
        self._elapsed.clear()
        self.entered.set()
        kick = asyncio.ensure_future(event.wait())
        elapse = asyncio.ensure_future(self._elapsed.wait())
        try:
            await asyncio.wait({kick, elapse}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            kick.cancel()
            elapse.cancel()
        self.entered.clear()
        self.kicked.append(event.is_set())

    def elapse(self) -> None:
        """The wait in progress times out (the clock moves by its whole timeout)."""
        self.now_s += self._timeout_s
        self._elapsed.set()


async def until(condition: Callable[[], bool], *, deadline_s: float = 5.0) -> None:
    """Yield to the event loop until ``condition`` holds; fail after ``deadline_s`` real seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not condition():
        if loop.time() >= end:
            raise AssertionError(f"condition not met within {deadline_s}s")
        await asyncio.sleep(0.001)


# ---------------------------------------------------------------- bundles
@dataclass(frozen=True)
class FakeVerified:
    """``importer.VerifiedBundle``."""

    manifest: BundleManifest
    signed_by: str = "factory"
    key_id_hex: str = "F00D"
    manifest_digest: str = "sha256:" + "f" * 64
    linked: tuple[str, ...] = ()


class FakeServer:
    """``importer.BundleServerPort``: records its life; serves ``bytes`` and ``rejections``."""

    def __init__(
        self,
        root: Path,
        blobs: Mapping[str, ExpectedFile],
        *,
        bytes_served: int = 0,
        rejections: Sequence[BundleError] = (),
    ) -> None:
        self.root = root
        self.blobs = dict(blobs)
        self._bytes = bytes_served
        self._rejections = tuple(rejections)
        self.calls: list[str] = []
        self.requests = 0
        """Requests that reached it (a test's runtime counts probe pulls through the mirror)."""

    @property
    def mirror_host(self) -> str:
        return "127.0.0.1:5999"

    @property
    def rejections(self) -> tuple[BundleError, ...]:
        return self._rejections

    def bytes_served(self) -> int:
        return self._bytes

    def requests_seen(self) -> int:
        return self.requests

    async def start(self) -> None:
        self.calls.append("start")

    async def close(self) -> None:
        self.calls.append("close")


class FakeMirror:
    """``importer.MirrorPort``: whether the drop-in exists, and every write."""

    def __init__(self) -> None:
        self.writes: list[tuple[tuple[str, ...], str]] = []
        self.tagged: list[tuple[str, ...]] = []
        self.removals = 0
        self.is_written = False

    def write(self, repositories: Any, mirror_host: str, *, tagged: Any = ()) -> bool:
        self.writes.append((tuple(repositories), mirror_host))
        self.tagged.append(tuple(tagged))
        self.is_written = True
        return True

    def remove(self) -> bool:
        self.removals += 1
        was, self.is_written = self.is_written, False
        return was


class MemorySpecs:
    """``importer.SpecSink``: the files written, by name."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str, bool]] = {}

    def write_set(self, file_name: str, text: str, *, is_persistent: bool) -> Path:
        self.files[file_name] = (text, is_persistent)
        return Path("/etc/nodeagent/pinnedimagesets") / file_name


# ---------------------------------------------------------------- media
@dataclass
class FakeMedium:
    """``imports.MountedMedium``."""

    target: Path
    unmounts: list[bool] = field(default_factory=list)
    unmount_error: NodeAgentError | None = None
    """Raised by every unmount (a mount point still in use)."""

    def unmount(self, *, lazy: bool = False) -> None:
        self.unmounts.append(lazy)
        if self.unmount_error is not None:
            raise self.unmount_error


class FakeMounter:
    """``imports.Mounter``: mounts succeed unless an error is queued for the device."""

    def __init__(self, errors: Mapping[str, NodeAgentError] | None = None) -> None:
        self.errors = dict(errors or {})
        """Per device, the error its next mount raises (once)."""
        self.mounted: list[FakeMedium] = []
        self.calls: list[tuple[str, str, Path]] = []
        self.gate = threading.Event()
        """Mounts (in their thread) wait for it: clear it to hold them, as a slow stick does."""
        self.gate.set()
        self.unmount_error: NodeAgentError | None = None
        """Given to every medium mounted from now on (``FakeMedium.unmount_error``)."""

    def __call__(self, devnode: str, fs_type: str, target_dir: Path) -> FakeMedium:
        self.calls.append((devnode, fs_type, target_dir))
        if not self.gate.wait(timeout=10):
            raise AssertionError("the test never let the mount finish")
        error = self.errors.pop(devnode, None)
        if error is not None:
            raise error
        medium = FakeMedium(target_dir, unmount_error=self.unmount_error)
        self.mounted.append(medium)
        return medium


class QueueSource:
    """``imports.MediaSource``: the media present at start, then what the test ``feed``s."""

    def __init__(self, existing: Sequence[MediaEvent] = ()) -> None:
        self._existing = list(existing)
        self._queue: asyncio.Queue[MediaEvent | None] = asyncio.Queue()
        self.handled = 0
        """Events fed that the consumer has finished handling (it asked for the next)."""

    def existing(self) -> list[MediaEvent]:
        return list(self._existing)

    def feed(self, *events: MediaEvent) -> None:
        for event in events:
            self._queue.put_nowait(event)

    def close(self) -> None:
        self._queue.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[MediaEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[MediaEvent]:
        while (event := await self._queue.get()) is not None:
            yield event
            self.handled += 1


@dataclass
class Call:
    """One ``import_bundle`` call of ``ScriptedImporter``: its arguments and how it ended."""

    root: Path
    source: str
    was_present: bool
    outcome: str = "running"
    """``running``, ``returned``, ``cancelled``."""


class ScriptedImporter:
    """Stands in for ``importer.Importer`` in ``MediaImports``: each import waits for ``release``.

    ``state`` is the state of the report it returns; ``cleanup`` is awaited when the import is
    cancelled, as the real importer awaits removing its mirror (a reload) before it gives up.
    With ``is_stored_first`` it releases its medium at once (``release_medium``), as the real
    importer does once the bundle is in the node's image store.
    """

    def __init__(
        self,
        is_present: Callable[[Path], bool],
        *,
        state: BundleState = "imported",
        release_medium: Callable[[Path], None] = lambda _root: None,
        is_stored_first: bool = False,
    ) -> None:
        self.is_present = is_present
        self.release_medium = release_medium
        self.is_stored_first = is_stored_first
        self.state = state
        self.calls: list[Call] = []
        self.release = asyncio.Event()
        self.cleanup = asyncio.Event()
        self.cleanup.set()

    async def import_bundle(self, root: Path, *, source: str) -> BundleReport:
        call = Call(root, source, self.is_present(root))
        self.calls.append(call)
        if self.is_stored_first:
            self.release_medium(root)
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            call.outcome = "cancelled"
            await self.cleanup.wait()
            raise
        call.outcome = "returned"
        return BundleReport(source, self.state, bundle_id="b1")

    def outcomes(self) -> list[str]:
        return [call.outcome for call in self.calls]
