"""PinnedImageSet files: YAML documents read from the spec directories.

A file holds one or more ``machineconfiguration.openshift.io/v1`` PinnedImageSet
objects, as separate documents or as the items of a ``kind: List``. Each set is
checked as the API server's schema would check it (``spec.pinnedImages`` of 1 to
500 unique digest references, nothing else in ``spec``). A bad set becomes a
``SpecProblem`` naming file, object and entry, and the good sets next to it still
load; a file that is not YAML is one problem. A set name defined twice keeps its
first definition: directories in the given order, files in lexical order.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from nodeagent.errors import ImageReferenceInvalid, SpecInvalid
from nodeagent.references import PinnedImageRef, parse_pinned_image_ref
from nodeagent.strict import MalformedInput, clip, load_yaml

API_VERSION = "machineconfiguration.openshift.io/v1"
KIND = "PinnedImageSet"
MAX_IMAGES = 500
MAX_SPEC_FILE_BYTES = 4 * 1024 * 1024
"""A spec file larger than this is refused unread: the API server stores at most ~1.5 MiB per
object (docs/runtime-facts.md), and a file holds a few sets at most."""
MAX_SPEC_DEPTH = 32
"""A PinnedImageSet is nested 4 deep (spec.pinnedImages[].name); labels and annotations add
one. Deeper input is refused before it is composed."""
SPEC_SUFFIXES = (".yaml", ".yml")
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MAX_NAME_LENGTH = 253
_TOP_LEVEL_FIELDS = ("apiVersion", "kind", "metadata", "spec")
MAX_FILE_STEM_BYTES = 200
"""A set's name as (part of) a file name is at most this long, so that the file, the
temporary name of its atomic write (14 bytes more) and a set-aside copy (26 more) stay within
NAME_MAX (255 bytes) even with a prefix and a suffix; the API allows 253-character names."""
FILE_STEM_HASH_CHARS = 16


@dataclass(frozen=True, slots=True)
class PinnedImageSet:
    """One valid set: the images to pull and pin, and where the set came from."""

    name: str
    images: tuple[PinnedImageRef, ...]
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    generation: int | None = None
    source: str = ""
    is_persistent: bool = True


@dataclass(frozen=True, slots=True)
class SpecProblem:
    """Why a file or one set in it was not loaded; ``reason`` is the error's reason code."""

    source: str
    object_name: str | None
    reason: str
    message: str
    """Self-contained: it names the file (the journal and the status object show it alone)."""

    def text(self) -> str:
        """The message naming its file once: as it is when it names the file, else prefixed."""
        shown = clip(self.source, 200)
        return self.message if shown in self.message else f"{shown}: {self.message}"


@dataclass(frozen=True, slots=True)
class SpecLoad:
    """The sets that loaded and the problems found, both in a deterministic order."""

    sets: tuple[PinnedImageSet, ...] = ()
    problems: tuple[SpecProblem, ...] = ()


def parse_spec_text(text: str | bytes, *, source: str, is_persistent: bool) -> SpecLoad:
    """Parse one file's text; ``source`` (the file's path) is only used in messages and results.

    The YAML is read strictly and within bounds (``strict.load_yaml``): whatever the file
    holds, the result is sets and problems, never an exception.
    """
    try:
        documents = load_yaml(
            text, what=clip(source, 200), max_bytes=MAX_SPEC_FILE_BYTES, max_depth=MAX_SPEC_DEPTH
        )
    except MalformedInput as exc:
        return SpecLoad(problems=(SpecProblem(source, None, SpecInvalid.reason, str(exc)),))
    sets: list[PinnedImageSet] = []
    problems: list[SpecProblem] = []
    for obj in _objects(documents):
        try:
            sets.append(_parse_object(obj, source=source, is_persistent=is_persistent))
        except SpecInvalid as exc:
            problems.append(SpecProblem(source, _name_of(obj), exc.reason, exc.message))
    if not sets and not problems:
        message = (
            f"{clip(source, 200)} holds no PinnedImageSet (empty, only comments, or caught "
            "half-written); sets it held stay pinned until it is fixed: remove the file to "
            "unpin them"
        )
        problems.append(SpecProblem(source, None, SpecInvalid.reason, message))
    return _deduplicate([SpecLoad(tuple(sets), tuple(problems))])


def load_spec_dirs(dirs: Sequence[tuple[Path, bool]]) -> SpecLoad:
    """Load every ``*.yaml``/``*.yml`` file of each ``(directory, is_persistent)``, in order.

    Not recursive; files in lexical order, names starting with ``.`` skipped (temporary
    files of atomic writers). A missing directory holds no sets; an unreadable one or an
    unreadable file is a problem.
    """
    loads: list[SpecLoad] = []
    for directory, is_persistent in dirs:
        try:
            files = _spec_files(directory)
        except OSError as exc:
            loads.append(_file_problem(directory, f"cannot list {directory}: {exc.strerror}"))
            continue
        loads.extend(_load_file(path, is_persistent=is_persistent) for path in files)
    return _deduplicate(loads)


SELF_SET: Final = "nodeagent-self"
"""The set that keeps nodeagent's own image (the container variant, decision 0074): the
store keeps the bundle holding the image the daemon runs as pinned by it, always. No spec
file, bundle or cluster object may name a set so (it would pose as nodeagent's own)."""


def is_kept_always(name: str) -> bool:
    """A set nothing unpins nor retires (``nodeagent-self``); ``unpin``, ``bundle remove``
    and the retirement of old releases leave it alone."""
    return name == SELF_SET


def parse_set_object(obj: Any, *, source: str, is_persistent: bool) -> PinnedImageSet:
    """One PinnedImageSet object (a decoded document) checked as a spec file's, or SpecInvalid."""
    return _parse_object(obj, source=source, is_persistent=is_persistent)


def set_fingerprint(image_set: PinnedImageSet) -> str:
    """sha256 (hex) of the set's sorted image references: equal exactly when the images are."""
    text = "\n".join(sorted(str(ref) for ref in image_set.images))
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------- files


def file_stem(name: str, *, limit: int = MAX_FILE_STEM_BYTES) -> str:
    """``name`` for a file name: itself when at most ``limit - 17`` bytes, else its first
    ``limit - 17`` bytes, ``-`` and the first 16 hex digits of its SHA-256 (exactly ``limit``
    bytes). Stable across versions and hosts; the two forms never have the same length, so a
    short name cannot take the file of a long one. Files are found by their content's name,
    never by their file name (docs/cluster.md, "Set names and file names")."""
    keep = limit - FILE_STEM_HASH_CHARS - 1
    raw = name.encode()
    if len(raw) <= keep:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:FILE_STEM_HASH_CHARS]
    return f"{raw[:keep].decode(errors='ignore')}-{digest}"


def _spec_files(directory: Path) -> list[Path]:
    try:
        names = sorted(entry.name for entry in directory.iterdir())
    except FileNotFoundError:
        return []
    wanted = [n for n in names if n.endswith(SPEC_SUFFIXES) and not n.startswith(".")]
    return [directory / name for name in wanted if not (directory / name).is_dir()]


def _load_file(path: Path, *, is_persistent: bool) -> SpecLoad:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_SPEC_FILE_BYTES + 1)
    except OSError as exc:
        return _file_problem(path, f"cannot read {path}: {exc.strerror}")
    return parse_spec_text(data, source=str(path), is_persistent=is_persistent)


def _file_problem(path: Path, message: str) -> SpecLoad:
    return SpecLoad(problems=(SpecProblem(str(path), None, SpecInvalid.reason, message),))


def _deduplicate(loads: Iterable[SpecLoad]) -> SpecLoad:
    kept: dict[str, PinnedImageSet] = {}
    problems: list[SpecProblem] = []
    for load in loads:
        problems.extend(load.problems)
        for image_set in load.sets:
            first = kept.setdefault(image_set.name, image_set)
            if first is not image_set:
                problems.append(_duplicate_problem(first, image_set))
    return SpecLoad(tuple(kept.values()), tuple(problems))


def _duplicate_problem(first: PinnedImageSet, later: PinnedImageSet) -> SpecProblem:
    first_source, later_source = clip(first.source, 200), clip(later.source, 200)
    if first.source == later.source:
        message = (
            f"PinnedImageSet {later.name!r} is defined twice in {later_source}; keeping the first"
        )
    else:
        message = (
            f"PinnedImageSet {later.name!r} in {later_source} is also defined in {first_source}; "
            f"keeping {first_source}"
        )
    return SpecProblem(later.source, later.name, SpecInvalid.reason, message)


# ---------------------------------------------------------------- objects


def _objects(documents: Iterable[Any]) -> Iterable[Any]:
    """The objects of a file: its documents, with the items of ``kind: List`` spread out."""
    for document in documents:
        if document is None:
            continue
        items = document.get("items") if isinstance(document, dict) else None
        if (
            isinstance(document, dict)
            and document.get("kind") == "List"
            and isinstance(items, list)
        ):
            yield from items
        else:
            yield document


def _name_of(obj: Any) -> str | None:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else None


def _parse_object(obj: Any, *, source: str, is_persistent: bool) -> PinnedImageSet:
    shown = clip(source, 200)
    where = f"{shown}: PinnedImageSet {clip(_name_of(obj) or '(unnamed)', 100)}"
    if not isinstance(obj, dict):
        raise SpecInvalid(f"{shown}: a document is {_kind_of_value(obj)}, not an object")
    _check_type(obj, where)
    _check_fields(obj, _TOP_LEVEL_FIELDS, "", where)
    metadata = _mapping(obj.get("metadata"), "metadata", where)
    name = _object_name(metadata, where)
    where = f"{shown}: PinnedImageSet {name!r}"
    if is_kept_always(name):
        raise SpecInvalid(f"{where}: the name {SELF_SET} is nodeagent's own set; use another")
    spec = _mapping(obj.get("spec"), "spec", where)
    _check_fields(spec, ("pinnedImages",), "spec.", where)
    return PinnedImageSet(
        name=name,
        images=_images(spec.get("pinnedImages"), where),
        labels=_labels(metadata.get("labels"), where),
        generation=_generation(metadata.get("generation"), where),
        source=source,
        is_persistent=is_persistent,
    )


def _check_type(obj: Mapping[Any, Any], where: str) -> None:
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if api_version != API_VERSION or kind != KIND:
        raise SpecInvalid(
            f"{where}: apiVersion {_shown(api_version)} kind {_shown(kind)} is not a "
            f"PinnedImageSet; expected apiVersion {API_VERSION!r} and kind {KIND!r}"
        )


def _check_fields(obj: Mapping[Any, Any], known: Sequence[str], prefix: str, where: str) -> None:
    unknown = sorted(str(key) for key in obj if key not in known)
    if unknown:
        allowed = ", ".join(prefix + name for name in known)
        field = clip(prefix + unknown[0], 100)
        raise SpecInvalid(f"{where}: unknown field {field} (allowed: {allowed})")


def _mapping(value: Any, path: str, where: str) -> Mapping[Any, Any]:
    if not isinstance(value, dict):
        raise SpecInvalid(f"{where}: {path} must be a mapping, got {_kind_of_value(value)}")
    return value


def _object_name(metadata: Mapping[Any, Any], where: str) -> str:
    name = metadata.get("name")
    if name is None or name == "":
        raise SpecInvalid(f"{where}: metadata.name is missing")
    if not isinstance(name, str):
        raise SpecInvalid(f"{where}: metadata.name must be a string, got {_shown(name)}")
    if len(name) > _MAX_NAME_LENGTH or _DNS_SUBDOMAIN_RE.fullmatch(name) is None:
        raise SpecInvalid(
            f"{where}: metadata.name {_shown(name)} is not a DNS subdomain (at most 253 lowercase "
            "letters, digits, '-' and '.', starting and ending with a letter or digit)"
        )
    return name


def _labels(value: Any, where: str) -> Mapping[str, str]:
    if value is None:
        return MappingProxyType({})
    labels = _mapping(value, "metadata.labels", where)
    for key, label in labels.items():
        if not isinstance(key, str) or not isinstance(label, str):
            raise SpecInvalid(
                f"{where}: metadata.labels entry {_shown(key)}: {_shown(label)} must map a string "
                'to a string; quote values such as "true" or "1"'
            )
    return MappingProxyType(dict(labels))


def _generation(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecInvalid(
            f"{where}: metadata.generation must be a non-negative integer, got {_shown(value)}"
        )
    return value


def _images(value: Any, where: str) -> tuple[PinnedImageRef, ...]:
    if not isinstance(value, list):
        raise SpecInvalid(f"{where}: spec.pinnedImages must be a list, got {_kind_of_value(value)}")
    if not 1 <= len(value) <= MAX_IMAGES:
        raise SpecInvalid(
            f"{where}: spec.pinnedImages has {len(value)} entries; it must have 1 to {MAX_IMAGES}"
        )
    first_index: dict[PinnedImageRef, int] = {}
    for index, item in enumerate(value):
        ref = _image(item, f"{where}: spec.pinnedImages[{index}]")
        first = first_index.setdefault(ref, index)
        if first != index:
            raise SpecInvalid(
                f"{where}: spec.pinnedImages[{index}] ({ref}) duplicates spec.pinnedImages[{first}]"
            )
    return tuple(first_index)


def _image(item: Any, where: str) -> PinnedImageRef:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise SpecInvalid(f"{where} must be a mapping with a string 'name', got {_shown(item)}")
    _check_fields(item, ("name",), "", where)
    try:
        return parse_pinned_image_ref(item["name"])
    except ImageReferenceInvalid as exc:
        raise ImageReferenceInvalid(clip(f"{where}: {exc.message}", 800)) from exc


def _shown(value: Any) -> str:
    """A value from the file for a message: its repr, clipped and escaped."""
    return clip(
        repr(value) if not isinstance(value, (dict, list)) else f"a {type(value).__name__}", 100
    )


def _kind_of_value(value: Any) -> str:
    """The type of a value from the file, and its start (never the repr of a whole structure)."""
    if value is None:
        return "missing"
    if isinstance(value, dict | list):
        return f"a {type(value).__name__} of {len(value)} entries"
    return f"a {type(value).__name__} ({clip(repr(value), 60)})"
