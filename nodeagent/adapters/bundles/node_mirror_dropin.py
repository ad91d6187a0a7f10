"""The node mirror's registries.conf.d drop-in on the host (docs/mirror.md, decision 0058).

One file, ``[mirror]``'s ``98-nodeagent-node-mirror.conf`` in the runtime's
registries.conf.d, names exactly the repositories the store holds (``held_repositories``:
the images of the store's ``index.json``, which the store rewrites whenever a bundle or a
registry set is stored or removed: every record whose top manifest is stored) with the
node mirror first. Its text
is ``registries.dropin.render_mirror_dropin``'s, each entry restating the one that applied to
its repository in registries.conf and the other drop-ins; nodeagent's own two files are left
out of that reading (this one, and the import's ``99-nodeagent-bundle-mirror.conf``, which
in turn restates this one while an import runs).

Before anything is written, every file the runtime will read, this one's new text in its
place, is read again strictly (``registries.read_registries_conf``, containers/image's
rules): another component's malformed file is ``RegistriesConfInvalid`` (left untouched,
ours not rewritten), and a merge that would break a rule is never written. The write is
atomic, mode 0644 (podman and skopeo read the directory as any user), and only when the
bytes change: the caller reloads CRI-O once per change. No repository held: no file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from nodeagent.adapters.files import read_bytes_bounded, remove_file, write_atomic
from nodeagent.adapters.host import registries_texts
from nodeagent.errors import ConfigInvalid, ImageReferenceInvalid, RegistriesConfInvalid
from nodeagent.references import parse_pinned_image_ref
from nodeagent.registries import RegistriesConf, read_registries_conf
from nodeagent.registries.dropin import (
    NODE_MIRROR_HEADER,
    blocked_sources,
    is_mirrorable,
    render_mirror_dropin,
    repository_name,
)
from nodeagent.store import layout

MAX_BUNDLE_MANIFEST_BYTES: Final = 16 << 20
"""A stored ``bundle.json``'s bound (``bundles.manifest``'s, which is not imported here)."""
SERVED_TAGS_KEY: Final = b'"servedTags"'
"""Only a manifest holding this key is parsed: most bundles serve no tag."""
DROPIN_MODE: Final = 0o644
"""podman and skopeo read registries.conf.d as whatever user runs them."""

Action = Literal["wrote", "unchanged", "removed", "absent", "refused"]


@dataclass(frozen=True, slots=True)
class Held:
    """The repositories the store holds (``host/path``, normalized), and those of them whose
    signed tags the node mirror answers (``tag-only``: a stored bundle's ``servedTags``)."""

    repositories: tuple[str, ...] = ()
    tagged: frozenset[str] = frozenset()
    skipped: int = 0
    """Image names of records that are no digest reference nodeagent can mirror."""


@dataclass(frozen=True, slots=True)
class DropinOutcome:
    action: Action
    path: Path
    repositories: int = 0
    blocked: tuple[str, ...] = ()
    """Repositories whose source is blocked: the mirrors are their only way, no fallback."""
    reason: str = ""
    message: str = ""
    skipped: int = 0
    """Names of the store's index that are no mirrorable digest reference (never written)."""


def held_repositories(store_root: Path) -> Held:
    """The repositories of the images ``index.json`` lists (read without the store lock:
    it is replaced atomically), and those of them whose tags a stored bundle serves
    (``servedTags``: their entries also send pulls by tag to the node mirror, ``tag-only``);
    none when there is no store yet."""
    data = read_bytes_bounded(store_root / layout.INDEX_NAME, layout.MAX_INDEX_BYTES)
    names: set[str] = set()
    skipped = 0
    for name in layout.index_names(data) if data is not None else ():
        try:
            ref = parse_pinned_image_ref(name)
        except ImageReferenceInvalid:
            skipped += 1
            continue
        names.add(repository_name(ref.host, ref.repository))
    repositories = tuple(sorted(names))
    kept = tuple(r for r in repositories if is_mirrorable(r))
    tagged = served_tag_repositories(store_root) if kept else frozenset()
    return Held(kept, tagged & frozenset(kept), skipped + len(repositories) - len(kept))


def served_tag_repositories(store_root: Path) -> frozenset[str]:
    """The repositories of the tags the store's bundles serve (``servedTags`` of each
    recorded bundle's signed manifest, verified when it was stored). Read here, not through
    ``bundles.manifest``: the daemon renders this file at idle, and the manifest, tags and
    signature code stay unloaded until a bundle comes (tests/unit/test_idle_imports.py)."""
    bundles = store_root / layout.BUNDLES_DIR
    try:
        names = sorted(entry.name for entry in bundles.iterdir())
    except OSError:  # no bundle stored yet
        return frozenset()
    found: set[str] = set()
    for name in names:
        directory = bundles / name
        if not layout.is_bundle_id(name) or not (directory / layout.RECORD_NAME).is_file():
            continue  # the record is written last: without it the bundle does not count
        data = read_bytes_bounded(directory / layout.MANIFEST_NAME, MAX_BUNDLE_MANIFEST_BYTES)
        if data is not None and SERVED_TAGS_KEY in data:
            found |= _tag_repositories(data)
    return frozenset(found)


def _tag_repositories(data: bytes) -> set[str]:
    """``host/repository`` of each ``host/repository:tag`` key of ``servedTags``."""
    try:
        doc = json.loads(data)
    except ValueError:
        return set()
    tags = doc.get("servedTags") if isinstance(doc, dict) else None
    found: set[str] = set()
    for reference, digest in tags.items() if isinstance(tags, dict) else ():
        name = reference.rpartition(":")[0]
        try:
            ref = parse_pinned_image_ref(f"{name}@{digest}")
        except ImageReferenceInvalid:
            continue
        found.add(repository_name(ref.host, ref.repository))
    return found


class NodeMirrorDropin:
    """The drop-in at ``path`` (in the runtime's registries.conf.d) for the node mirror at
    ``mirror_host``; ``registries_conf``: the runtime's main file; ``own_names``: nodeagent's
    other drop-ins in that directory, never restated here (the import's)."""

    def __init__(
        self,
        path: Path,
        registries_conf: Path,
        mirror_host: str,
        own_names: Iterable[str] = (),
    ) -> None:
        if path.suffix != ".conf" or "/" in path.name:
            raise ConfigInvalid(
                f"mirror drop-in {path} must end in .conf: containers-image ignores other files"
            )
        self.path = path
        self.registries_conf = registries_conf
        self.mirror_host = mirror_host
        self.own_names = frozenset({path.name, *own_names})

    def _others(self) -> list[tuple[str, str]]:
        texts = registries_texts(self.registries_conf, self.path.parent)
        return [t for t in texts if t[0] not in self.own_names]

    def existing(self) -> RegistriesConf:
        """registries.conf and the other drop-ins, without nodeagent's own files."""
        return read_registries_conf(self._others())

    def render(self, held: Held, existing: RegistriesConf) -> str:
        return render_mirror_dropin(
            held.repositories,
            self.mirror_host,
            existing,
            tagged=held.tagged,
            header=NODE_MIRROR_HEADER,
        )

    def sync(self, held: Held) -> DropinOutcome:
        """Make the file mirror ``held``; what was done (``changed``: the runtime must reload)."""
        if not held.repositories:
            return DropinOutcome("removed" if self.remove() else "absent", self.path)
        try:
            existing = self.existing()
            text = self.render(held, existing)
            self._check_merged(text)
        except RegistriesConfInvalid as err:
            return DropinOutcome(
                "refused", self.path, len(held.repositories), (), err.reason, err.message
            )
        blocked = blocked_sources(held.repositories, existing)
        changed = write_atomic(self.path, text.encode(), mode=DROPIN_MODE)
        action: Action = "wrote" if changed else "unchanged"
        return DropinOutcome(
            action, self.path, len(held.repositories), blocked, skipped=held.skipped
        )

    def _check_merged(self, text: str) -> None:
        """Every file the runtime will read, ours in its place, read as containers/image does;
        our own text breaking a rule is reported as ours (never written)."""
        files = registries_texts(self.registries_conf, self.path.parent)
        merged = [t for t in files if t[0] != self.path.name] + [(self.path.name, text)]
        merged.sort(key=lambda t: (t[0] != str(self.registries_conf), t[0]))
        read_registries_conf(merged)

    def remove(self) -> bool:
        """Remove the drop-in; False if it was already gone."""
        return remove_file(self.path)

    @property
    def changed_actions(self) -> frozenset[str]:
        return frozenset({"wrote", "removed"})
