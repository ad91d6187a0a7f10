"""A CRI-O that pins, in memory, and its config files: stand-ins for unit tests of services.

``FakeCrio`` implements ``nodeagent.ports.ImageRuntime`` and simulates CRI-O's
pinning: an image is pinned when one of its names matches (``pins.pattern_matches``)
a pattern of the ``[crio.image] pinned_images`` that the runtime last loaded,
the last file in CRI-O's reading order that sets the key winning (``MemoryConfDir``
reads a drop-in directory in that order). It loads its files when it starts and on
``reload`` (SIGHUP), never on a mere write. Its store keeps one image per digest, under
every name it was pulled by, and refuses references with an upper-case repository.

tests/service/crio_pins_contract.py holds what it claims; the same assertions run against
it (tests/service/test_crio_pins.py) and against a real CRI-O
(tests/integration/adapters/cri/test_crio_pins.py).
"""

from __future__ import annotations

import tomllib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from nodeagent.errors import RuntimeCallFailed
from nodeagent.pins import ConfigFile, pattern_matches
from nodeagent.ports import FilesystemUsage, RegistryCredentials, RuntimeVersion, StoredImage

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
IMAGES_DIR = "/var/lib/containers/storage/overlay-images"
"""ImageFsInfo's mountpoint: ``<graphroot>/<driver>-images`` of a default CRI-O."""
DIR_BYTES, IMAGE_METADATA_BYTES, IMAGE_METADATA_INODES = 4096, 6 * 1024, 4
"""The metadata directory's usage: itself and, per image, its directory, manifest, config
and signatures (about what a real CRI-O reports; the layers live elsewhere)."""


def crio_config(patterns: Sequence[str]) -> str:
    quoted = ", ".join(f'"{p}"' for p in patterns)
    return f"[crio.image]\npinned_images = [{quoted}]\n"


class MemoryConfDir:
    """CRI-O's drop-in directory (``crio.conf.d``) in memory: its files by name.

    CRI-O reads them with Go's ``filepath.Walk``: in bytewise order of their names.
    """

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def texts_in_crio_order(self) -> list[str]:
        return [self.files[name] for name in sorted(self.files, key=str.encode)]


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


def _refuse_upper_case(ref: str) -> None:
    """CRI-O parses references first: upper case is allowed in the host and tag only."""
    if "/" not in ref and "@" not in ref and ":" not in ref:
        return  # an image ID
    name = ref.partition("@")[0]
    first, slash, rest = name.partition("/")
    is_host = bool(slash) and ("." in first or ":" in first or first == "localhost")
    path = rest if is_host else name
    last = path.rpartition("/")[2]
    repository = path.rpartition(":")[0] if ":" in last else path
    if repository != repository.lower():
        raise RuntimeCallFailed(f"cannot parse input: {ref!r}: repository name must be lowercase")


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
        digests = tuple(sorted(n for n in image.names if "@" in n))
        tags = tuple(sorted(n for n in image.names if "@" not in n))
        return StoredImage(image.id, tags, digests, image.size_bytes, self._is_pinned(image))

    def _find(self, ref: str) -> _Image | None:
        """The image with this ID or name (names compare exactly, as in containers-storage)."""
        _refuse_upper_case(ref)
        for image in self.images.values():
            if image.id == ref or ref in image.names:
                return image
        return None

    def _same_digest(self, ref: str) -> _Image | None:
        """An image stored under another name with the digest ``ref`` names."""
        digest = ref.partition("@")[2]
        for image in self.images.values():
            if digest and any(n.partition("@")[2] == digest for n in image.names):
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
        if found is None and (found := self._same_digest(ref)) is not None:
            found.names = (*found.names, ref)  # one image, one more name
        return found.id if found is not None else self.store(ref)

    async def remove_image(self, ref: str) -> None:
        """By ID: the image. By name: that name, and the image with its last name."""
        found = self._find(ref)
        if found is None:
            return
        found.names = () if ref == found.id else tuple(n for n in found.names if n != ref)
        if not found.names:
            del self.images[found.id]

    async def image_fs_info(self) -> list[FilesystemUsage]:
        """Like CRI-O: the usage of the images' metadata directory, not of their layers."""
        count = len(self.images)
        used = DIR_BYTES + IMAGE_METADATA_BYTES * count
        return [FilesystemUsage(IMAGES_DIR, used, 1 + IMAGE_METADATA_INODES * count)]
