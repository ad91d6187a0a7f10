"""CRI-O pins: which names to pin, the drop-in that says so, and proof that the runtime obeys.

CRI-O merges ``pinned_images`` by replacement: the last file (main config, then
drop-ins in CRI-O's reading order) that sets the key wins. nodeagent's drop-in sorts
last and therefore carries every pattern any other file sets, so pinning our
images never unpins someone else's (docs/runtime-facts.md, "CRI-O pinned images and
drop-ins").

Pure functions first (the configuration files in ``dropins``); ``PinService`` at the
bottom drives the ports.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from nodeagent.errors import PinsOverridden, RuntimeConfigInvalid, RuntimeDoesNotPin
from nodeagent.pins.dropins import CRASHING_PATTERNS as CRASHING_PATTERNS
from nodeagent.pins.dropins import DROPIN_HEADER as DROPIN_HEADER
from nodeagent.pins.dropins import MAX_FOREIGN_PATTERNS as MAX_FOREIGN_PATTERNS
from nodeagent.pins.dropins import MAX_PATTERN_CHARS as MAX_PATTERN_CHARS
from nodeagent.pins.dropins import MAX_RUNTIME_CONFIG_BYTES as MAX_RUNTIME_CONFIG_BYTES
from nodeagent.pins.dropins import ConfigFile as ConfigFile
from nodeagent.pins.dropins import ForeignFileProblem as ForeignFileProblem
from nodeagent.pins.dropins import ForeignPins as ForeignPins
from nodeagent.pins.dropins import foreign_pins as foreign_pins
from nodeagent.pins.dropins import pinned_images_of as pinned_images_of
from nodeagent.pins.dropins import render_dropin as render_dropin
from nodeagent.pins.dropins import toml_string as toml_string
from nodeagent.ports import ImageRuntime, Reloader, StoredImage
from nodeagent.strict import clip

log = structlog.get_logger(__name__)


# ---------------------------------------------------------------- patterns
def pattern_matches(pattern: str, name: str) -> bool:
    """Whether CRI-O would pin an image called ``name`` for ``pattern``.

    Mirrors CRI-O (``internal/storage/image.go``, ``CompileRegexpsForPinnedImages``):
    ``*kw*`` is a case-insensitive keyword search, ``prefix*`` a
    case-insensitive search for ``prefix`` followed by anything (not anchored
    at the start: ``quay.io/x*`` matches ``myquay.io/xyz``), anything else an
    exact case-insensitive match (a leading ``*`` alone is a literal star).

    A lone ``*`` is the one pattern where this function and CRI-O part ways:
    CRI-O takes it for a keyword and slices ``pattern[1:0]``, which panics, so
    a runtime whose effective list holds ``*`` crashes on start and on reload.
    Here it matches every name (an empty prefix, like ``**``), and
    ``render_dropin`` never writes it (see ``CRASHING_PATTERNS``).
    """
    if len(pattern) >= 2 and pattern.startswith("*") and pattern.endswith("*"):
        return pattern[1:-1].lower() in name.lower()
    if pattern.endswith("*"):
        return re.search(re.escape(pattern[:-1]), name, re.IGNORECASE) is not None
    return pattern.lower() == name.lower()


def is_covered(image: StoredImage, patterns: Iterable[str]) -> bool:
    """Whether any of ``patterns`` pins any name of ``image``."""
    names = image.names()
    return any(pattern_matches(p, n) for p in patterns for n in names)


# ---------------------------------------------------------------- runtime support
@dataclass(frozen=True, slots=True)
class PinSupport:
    """What a CRI-O version does with ``pinned_images`` (docs/runtime-facts.md, "CRI-O pinned
    images and drop-ins")."""

    is_pinning: bool
    is_repin_on_reload: bool
    is_unpin_on_empty: bool


def _version_tuple(version: str) -> tuple[int, int, int] | None:
    match = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def pin_support(runtime_name: str, runtime_version: str) -> PinSupport:
    """Whether this runtime honours CRI-O's ``pinned_images`` and its reload semantics."""
    version = _version_tuple(runtime_version)
    if runtime_name != "cri-o" or version is None:
        return PinSupport(False, False, False)
    repin = version >= (1, 30, 0) or (1, 29, 4) <= version < (1, 30, 0)
    unpin = (
        version >= (1, 31, 0)
        or (1, 30, 3) <= version < (1, 31, 0)
        or (1, 29, 7) <= version < (1, 30, 0)
    )
    return PinSupport(version >= (1, 28, 0), repin, unpin)


def support_problem(runtime_name: str, runtime_version: str) -> str | None:
    """A technician's explanation when the runtime cannot pin by reload; None when it can."""
    support = pin_support(runtime_name, runtime_version)
    where = f"{runtime_name} {runtime_version}"
    if not support.is_pinning:
        return f"{where} does not support pinned_images; CRI-O 1.28.0 or later is needed"
    if not support.is_repin_on_reload:
        return f"{where} applies pins only when it restarts; upgrade CRI-O to 1.29.4 or later"
    return None


# ---------------------------------------------------------------- verification
@dataclass(frozen=True, slots=True)
class PinCheck:
    """The runtime's view of the pins, from one ListImages call."""

    not_pinned: tuple[str, ...]
    """Our references whose stored image reports ``pinned: false``."""
    still_pinned: tuple[str, ...]
    """References we released that no remaining pattern covers, yet report pinned."""
    absent: tuple[str, ...]
    """Our references the runtime does not have (wiped or removed)."""

    @property
    def is_settled(self) -> bool:
        return not self.not_pinned and not self.still_pinned


def check_pins(
    images: Sequence[StoredImage],
    wanted: Collection[str],
    released: Collection[str],
    all_patterns: Collection[str],
) -> PinCheck:
    """Compare the runtime's images with what we pinned and what we stopped pinning."""
    by_name: dict[str, StoredImage] = {}
    for image in images:
        for name in image.names():
            by_name[name.lower()] = image
    not_pinned, absent, still = [], [], []
    for ref in sorted(wanted):
        found = by_name.get(ref.lower())
        if found is None:
            absent.append(ref)
        elif not found.is_pinned:
            not_pinned.append(ref)
    for ref in sorted(set(released) - set(wanted)):
        gone = by_name.get(ref.lower())
        if gone is not None and gone.is_pinned and not is_covered(gone, all_patterns):
            still.append(ref)
    return PinCheck(tuple(not_pinned), tuple(still), tuple(absent))


# ---------------------------------------------------------------- ports
class DropinStore(Protocol):
    """Reads CRI-O's config files and writes nodeagent's drop-in (``adapters.crio_config``)."""

    def read_other_configs(self) -> list[ConfigFile]: ...

    def write_dropin(self, text: str) -> bool: ...

    def read_dropin(self) -> str | None: ...


# ---------------------------------------------------------------- service
@dataclass(frozen=True, slots=True)
class PinOutcome:
    patterns: tuple[str, ...]
    foreign: ForeignPins
    is_changed: bool
    reload_path: str | None
    check: PinCheck


class PinService:
    """Render, write, reload, verify. One call of ``apply`` per change of the wanted pins."""

    def __init__(
        self,
        store: DropinStore,
        reloader: Reloader,
        runtime: ImageRuntime,
        *,
        verify_timeout_s: float = 60.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.reloader = reloader
        self.runtime = runtime
        self.verify_timeout_s = verify_timeout_s
        self._sleep = sleep
        self._monotonic = monotonic
        # A write changed the drop-in but the reload after it failed: reload next time.
        self._is_reload_owed = False
        # Each foreign file's pins at its last good read, and the files found invalid.
        self._last_good: dict[str, tuple[str, ...]] = {}
        self._invalid: set[str] = set()

    def render(self, wanted: Collection[str]) -> tuple[str, ForeignPins]:
        """The drop-in text for ``wanted`` plus every other file's pins (no side effects)."""
        foreign = foreign_pins(self.store.read_other_configs(), self._last_good)
        return render_dropin([*wanted, *foreign.patterns]), foreign

    def _remember(self, foreign: ForeignPins) -> None:
        """Keep the good reads; say once when a file turns invalid and when it is fixed."""
        self._last_good.update(foreign.by_file)
        for problem in foreign.problems:
            if problem.path not in self._invalid:
                log.warning(
                    "runtime_config_invalid",
                    reason=RuntimeConfigInvalid.reason,
                    file=clip(problem.path),
                    error=problem.message,
                    pins_kept=len(problem.kept_patterns),
                )
        invalid = set(foreign.unreadable_files)
        for path in sorted(self._invalid - invalid):
            log.info("runtime_config_valid_again", file=clip(path))
        self._invalid = invalid

    def owe_reload(self) -> None:
        """Reload at the next write even if the bytes are unchanged.

        At start nodeagent cannot know whether its previous run crashed between
        writing the drop-in and reloading the runtime, so it reloads once.
        """
        self._is_reload_owed = True

    async def write(
        self, wanted: Collection[str], *, is_runtime_running: bool = True
    ) -> tuple[bool, str | None, ForeignPins]:
        """Write the drop-in and reload when its bytes changed; no verification.

        Also reloads when the bytes are unchanged but the reload after the write
        that changed them failed: otherwise the runtime would never see them.
        A runtime that is not running yet is not reloaded: it reads the file
        when it starts, and asking systemd to reload a unit whose start job is
        queued behind nodeagent's own would wait for nodeagent.
        """
        text, foreign = self.render(wanted)
        self._remember(foreign)
        is_changed = self.store.write_dropin(text)
        self._is_reload_owed = self._is_reload_owed or is_changed
        if not self._is_reload_owed or not is_runtime_running:
            return is_changed, None, foreign
        path = await self.reloader.reload()
        self._is_reload_owed = False
        patterns = len(set(wanted) | set(foreign.patterns))
        log.info("pins_written", patterns=patterns, is_changed=is_changed, reload=path)
        return is_changed, path, foreign

    async def apply(self, wanted: Collection[str], released: Collection[str] = ()) -> PinOutcome:
        """Pin ``wanted``, release ``released``, and prove it through CRI."""
        is_changed, path, foreign = await self.write(wanted)
        patterns = (*wanted, *foreign.patterns)
        if wanted and is_changed:
            await self._require_support()
        check = await self._verify(wanted, released, patterns)
        if check.not_pinned:
            await self._explain(check, foreign)
        return PinOutcome(tuple(sorted(set(patterns))), foreign, is_changed, path, check)

    async def _verify(
        self, wanted: Collection[str], released: Collection[str], patterns: Collection[str]
    ) -> PinCheck:
        deadline = self._monotonic() + self.verify_timeout_s
        delay_s = 0.1
        while True:
            check = check_pins(await self.runtime.list_images(), wanted, released, patterns)
            if check.is_settled or self._monotonic() >= deadline:
                return check
            await self._sleep(delay_s)
            delay_s = min(delay_s * 2, 2.0)

    async def _require_support(self) -> None:
        """Fail at once, instead of after the verify timeout, on a runtime that cannot pin."""
        version = await self.runtime.version()
        problem = support_problem(version.runtime_name, version.runtime_version)
        if problem is not None:
            raise RuntimeDoesNotPin(problem)

    async def _explain(self, check: PinCheck, foreign: ForeignPins) -> None:
        if foreign.overriding_files:
            files = ", ".join(clip(path) for path in foreign.overriding_files)
            raise PinsOverridden(
                f"{files} sort(s) after nodeagent's drop-in and set "
                f"pinned_images, which replaces nodeagent's list; {len(check.not_pinned)} images "
                "are not pinned. Rename that file to sort earlier or remove its pinned_images."
            )
        version = await self.runtime.version()
        problem = support_problem(version.runtime_name, version.runtime_version)
        if problem is not None:
            raise RuntimeDoesNotPin(problem)
        raise RuntimeDoesNotPin(
            f"{version.runtime_name} {version.runtime_version} reloaded but still reports "
            f"{len(check.not_pinned)} images unpinned (first: {check.not_pinned[0]}); "
            "check that the runtime reads the drop-in directory nodeagent writes to"
        )
