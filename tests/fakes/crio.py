"""A CRI-O that pins, in memory, and its config files: stand-ins for unit tests of services.

``FakeCrio`` implements ``nodeagent.ports.ImageRuntime`` and simulates CRI-O's
pinning: an image is pinned when one of its names matches (``pins.pattern_matches``)
a pattern of the ``[crio.image] pinned_images`` that the runtime last loaded,
the last file in CRI-O's reading order that sets the key winning. It loads its
files when it starts and on ``reload`` (SIGHUP), never on a mere write. This is
allowed because tests/integration/adapters/cri/test_client.py makes the same pin and reload
assertions against a real CRI-O.
"""

from __future__ import annotations

import tomllib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from nodeagent.pins import ConfigFile, pattern_matches
from nodeagent.ports import FilesystemUsage, RegistryCredentials, RuntimeVersion, StoredImage

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def crio_config(patterns: Sequence[str]) -> str:
    quoted = ", ".join(f'"{p}"' for p in patterns)
    return f"[crio.image]\npinned_images = [{quoted}]\n"


class MemoryDropins:
    """``pins.DropinStore`` in memory: other components' files plus nodeagent's drop-in."""

    def __init__(self, others: Sequence[ConfigFile] = ()) -> None:
        self.others = list(others)
        self.text: str | None = None
        self.writes = 0

    def read_other_configs(self) -> list[ConfigFile]:
        return list(self.others)

    def write_dropin(self, text: str) -> bool:
        self.writes += 1
        if text == self.text:
            return False
        self.text = text
        return True

    def read_dropin(self) -> str | None:
        return self.text

    def texts_in_crio_order(self) -> list[str]:
        """Every file as CRI-O reads them: earlier files, nodeagent's drop-in, later files."""
        before = [f.text for f in self.others if not f.is_after_ours]
        after = [f.text for f in self.others if f.is_after_ours]
        ours = [] if self.text is None else [self.text]
        return [*before, *ours, *after]


@dataclass
class _Image:
    id: str
    names: tuple[str, ...]
    size_bytes: int


PullHandler = Callable[[str], Awaitable[None]]


class FakeCrio:
    """``runtime.ImageRuntime`` with CRI-O's pin behaviour, in memory."""

    def __init__(
        self,
        *,
        version: str = "1.34.0",
        name: str = "cri-o",
        is_pinning: bool = True,
        is_repin_on_reload: bool = True,
        lists_before_pins_apply: int = 0,
        pull: PullHandler | None = None,
    ) -> None:
        self.runtime_version = version
        self.runtime_name = name
        self.is_pinning = is_pinning
        self.is_repin_on_reload = is_repin_on_reload
        self.lists_before_pins_apply = lists_before_pins_apply
        self.pull_handler = pull
        self.images: dict[str, _Image] = {}
        self.patterns: tuple[str, ...] = ()
        self._pending: tuple[str, ...] | None = None
        self._pending_lists = 0
        self.list_calls = 0
        self.reloads = 0
        self.pull_calls: list[str] = []
        self.pull_timeouts: list[float | None] = []
        self.inflight = 0
        self.max_inflight = 0

    # ---------------------------------------------------------------- test set-up
    def store(self, *names: str, size_bytes: int = 1000) -> str:
        image_id = f"{len(self.images) + 1:064x}"
        self.images[image_id] = _Image(image_id, names, size_bytes)
        return image_id

    def start(self, texts: Sequence[str]) -> None:
        """Load the config files the way CRI-O does when it starts."""
        self.patterns = self._effective(texts)

    def reload(self, texts: Sequence[str]) -> None:
        """SIGHUP: re-read the files; pins take effect after ``lists_before_pins_apply`` lists."""
        self.reloads += 1
        if not self.is_repin_on_reload:
            return
        self._pending = self._effective(texts)
        self._pending_lists = self.lists_before_pins_apply

    @staticmethod
    def _effective(texts: Sequence[str]) -> tuple[str, ...]:
        effective: list[str] = []
        for text in texts:
            image = tomllib.loads(text).get("crio", {}).get("image", {})
            if "pinned_images" in image:
                effective = [p for p in image["pinned_images"] if p]
        return (*effective, PAUSE_IMAGE)

    def pinned_names(self) -> dict[str, bool]:
        """Every digest name in the store and whether it is pinned right now."""
        return {
            name: self._is_pinned(image)
            for image in self.images.values()
            for name in image.names
            if "@" in name
        }

    def _is_pinned(self, image: _Image) -> bool:
        return self.is_pinning and any(
            pattern_matches(p, n) for p in self.patterns for n in image.names
        )

    def _stored(self, image: _Image) -> StoredImage:
        digests = tuple(n for n in image.names if "@" in n)
        tags = tuple(n for n in image.names if "@" not in n)
        return StoredImage(image.id, tags, digests, image.size_bytes, self._is_pinned(image))

    def _find(self, ref: str) -> _Image | None:
        for image in self.images.values():
            if image.id == ref or ref.lower() in (n.lower() for n in image.names):
                return image
        return None

    # ---------------------------------------------------------------- ImageRuntime
    async def version(self) -> RuntimeVersion:
        return RuntimeVersion(self.runtime_name, self.runtime_version, "v1")

    async def list_images(self) -> list[StoredImage]:
        self.list_calls += 1
        if self._pending is not None:
            if self._pending_lists == 0:
                self.patterns, self._pending = self._pending, None
            else:
                self._pending_lists -= 1
        return [self._stored(image) for image in self.images.values()]

    async def image_status(self, ref: str) -> StoredImage | None:
        found = self._find(ref)
        return None if found is None else self._stored(found)

    async def pull_image(
        self,
        ref: str,
        credentials: RegistryCredentials | None = None,
        *,
        timeout_s: float | None = None,
    ) -> str:
        self.pull_calls.append(ref)
        self.pull_timeouts.append(timeout_s)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.pull_handler is not None:
                await self.pull_handler(ref)
        finally:
            self.inflight -= 1
        found = self._find(ref)
        return found.id if found is not None else self.store(ref)

    async def remove_image(self, ref: str) -> None:
        found = self._find(ref)
        if found is not None:
            del self.images[found.id]

    async def image_fs_info(self) -> list[FilesystemUsage]:
        used = sum(image.size_bytes for image in self.images.values())
        return [FilesystemUsage("/var/lib/containers/storage/overlay-images", used, 0)]
