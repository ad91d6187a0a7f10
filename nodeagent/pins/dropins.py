"""CRI-O's configuration files as nodeagent reads and writes them: the ``pinned_images`` of
every other file (``foreign_pins``), and nodeagent's own drop-in (``render_dropin``).

CRI-O merges ``pinned_images`` by replacement (the package's docstring); these are the pure
parts that read each file strictly and render the drop-in that restates them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from nodeagent.strict import MalformedInput, clip, loads_toml

log = structlog.get_logger(__name__)

DROPIN_HEADER = (
    "Written by nodeagent. Do not edit: rewritten on every change.\n"
    "It carries the pinned_images of every other CRI-O config file too, because the\n"
    "last file that sets pinned_images replaces the list of all earlier ones."
)


CRASHING_PATTERNS = frozenset({"*"})
"""Patterns that make CRI-O panic when it compiles them; never copied, never written."""
MAX_RUNTIME_CONFIG_BYTES = 4 * 1024 * 1024
"""A larger CRI-O config file is invalid unread (CRI-O's are a few KiB, 500 pins ~60 KiB)."""
MAX_FOREIGN_PATTERNS = 65536
"""More patterns in one file make it invalid rather than carried."""
MAX_PATTERN_CHARS = 1024
"""Longer patterns (an image name is at most ~460 characters) make the file invalid."""


# ---------------------------------------------------------------- config files
@dataclass(frozen=True, slots=True)
class ConfigFile:
    """One CRI-O config file as read from disk, in the order CRI-O reads them."""

    path: str
    text: str
    is_after_ours: bool
    """Sorts after nodeagent's drop-in: a ``pinned_images`` here overrides ours."""
    error: str = ""
    """Why the file could not be read (too big, not UTF-8, a dangling link); ``text`` is empty."""


@dataclass(frozen=True, slots=True)
class ForeignFileProblem:
    """A foreign file CRI-O could not load either (reason ``RuntimeConfigInvalid``)."""

    path: str
    message: str
    kept_patterns: tuple[str, ...] = ()
    """Its pins from its last good read, still carried in nodeagent's drop-in."""


@dataclass(frozen=True, slots=True)
class ForeignPins:
    """The pins other components set, and who could override ours."""

    patterns: tuple[str, ...]
    overriding_files: tuple[str, ...]
    unreadable_files: tuple[str, ...]
    problems: tuple[ForeignFileProblem, ...] = ()
    by_file: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The pins of each file read well: the last good read of the next call."""


def pinned_images_of(text: str | bytes) -> list[str] | None:
    """``[crio.image] pinned_images`` of one config file, or None when the file does not set it.

    Empty strings are dropped (CRI-O skips them too). Raises ``ValueError`` (a clipped
    message) for a file CRI-O could not load either or nodeagent will not carry: not strict
    TOML within the size bound, a type CRI-O cannot decode (``crio = 1``,
    ``pinned_images = "a"``), too many patterns or one too long.
    """
    doc = loads_toml(text, what="the file", max_bytes=MAX_RUNTIME_CONFIG_BYTES)
    crio = _table(doc, "crio")
    image = _table(crio, "crio.image") if crio is not None else None
    if image is None or "pinned_images" not in image:
        return None
    value = image["pinned_images"]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        shown = f"a {type(value).__name__}" if isinstance(value, list | dict) else repr(value)
        raise MalformedInput(
            f"crio.image.pinned_images must be a list of strings, got {clip(shown, 80)}"
        )
    if len(value) > MAX_FOREIGN_PATTERNS:
        raise MalformedInput(f"crio.image.pinned_images has {len(value)} patterns, too many")
    for item in value:
        if len(item) > MAX_PATTERN_CHARS:
            raise MalformedInput(
                f"crio.image.pinned_images holds '{clip(item, 80)}', not an image name pattern"
            )
    return [item for item in value if item]


def _table(parent: dict[str, Any], key: str) -> dict[str, Any] | None:
    """``parent[last part of key]`` when it is a table; None when absent; ValueError otherwise."""
    value = parent.get(key.rpartition(".")[2])
    if value is None or isinstance(value, dict):
        return value
    raise MalformedInput(f"{key} must be a table, got {type(value).__name__}")


def foreign_pins(
    files: Sequence[ConfigFile], last_good: Mapping[str, tuple[str, ...]] | None = None
) -> ForeignPins:
    """Union of every other file's pins, plus the files that sort after ours and set pins.

    A file that sets the key overrides ours even with an empty list. Patterns
    that crash CRI-O (``CRASHING_PATTERNS``) are left out: copied into our
    drop-in, which sorts last, a ``*`` from a file whose list another file
    replaced would become effective and make the runtime panic on reload.
    A file that cannot be read is a problem; its pins of ``last_good`` (its last good
    read, by path) are still carried (docs/pins.md, "Other components' drop-ins").
    """
    patterns: set[str] = set()
    overriding: list[str] = []
    problems: list[ForeignFileProblem] = []
    by_file: dict[str, tuple[str, ...]] = {}
    for file in files:
        try:
            if file.error:
                raise MalformedInput(file.error)
            pins = pinned_images_of(file.text)
        except ValueError as exc:
            kept = (last_good or {}).get(file.path, ())
            patterns.update(kept)
            problems.append(ForeignFileProblem(file.path, f"{clip(file.path)}: {exc}", kept))
            continue
        usable = tuple(sorted({p for p in pins or () if p not in CRASHING_PATTERNS}))
        by_file[file.path] = usable
        patterns.update(usable)
        if pins is not None and file.is_after_ours:
            overriding.append(file.path)
    unreadable = tuple(problem.path for problem in problems)
    return ForeignPins(
        tuple(sorted(patterns)), tuple(overriding), unreadable, tuple(problems), by_file
    )


_TOML_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes, control characters and DEL
    escaped, everything else (UTF-8) as it is."""
    out = ['"']
    for char in text:
        if char in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[char])
        elif char < " " or char == "\x7f":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def render_dropin(patterns: Iterable[str]) -> str:
    """The drop-in text: ``[crio.image] pinned_images``, sorted and unique.

    Empty strings and ``CRASHING_PATTERNS`` are never written. Linear in the number of
    patterns (tomlkit took 41 CPU-s for 31,500, on the event loop; docs/performance.md).
    """
    pins = sorted({p for p in patterns if p and p not in CRASHING_PATTERNS})
    lines = [f"# {line}" for line in DROPIN_HEADER.splitlines()]
    lines += ["", "[crio.image]"]
    if pins:
        lines += ["pinned_images = [", *(f"    {toml_string(p)}," for p in pins), "]"]
    else:
        lines.append("pinned_images = []")
    return "\n".join(lines) + "\n"
