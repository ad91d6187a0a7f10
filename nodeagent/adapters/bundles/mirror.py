"""The bundle mirror's registries.conf.d drop-in on the host: write it, remove it.

The text comes from ``nodeagent.bundles.mirror.render_mirror_dropin``, given the
runtime's registries.conf and its other drop-ins as read now (strictly,
``registries.read_registries_conf``; a file nodeagent cannot read is ``ConfigInvalid``
and no drop-in is written): each entry restates the one it replaces. This adapter puts
it in place atomically (``nodeagent.adapters.files.write_atomic``:
temp file, fsync, rename, fsync of the directory; unchanged bytes are not
rewritten) and says whether anything changed, so the caller reloads CRI-O only
when needed. The runtime re-reads registries configuration on reload (SIGHUP).

containers-image reads only ``*.conf`` files directly inside registries.conf.d;
the temporary files of an atomic write (``.<name>.<random>.tmp``) are never
read, and a drop-in path with another suffix would be ignored silently, so it
is refused here.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from nodeagent.adapters.files import remove_file, write_atomic
from nodeagent.adapters.host import registries_texts
from nodeagent.bundles.mirror import render_mirror_dropin
from nodeagent.errors import ConfigInvalid
from nodeagent.registries import RegistriesConf, read_registries_conf


class MirrorDropin:
    """nodeagent's one mirror drop-in at ``path`` (in the runtime's registries.conf.d);
    ``registries_conf``: the runtime's main file, whose entries (and those of the drop-ins
    beside ``path``) the drop-in restates (None: none are read, tests of the drop-in alone)."""

    def __init__(self, path: Path, registries_conf: Path | None = None) -> None:
        if path.suffix != ".conf":
            raise ConfigInvalid(
                f"mirror drop-in {path} must end in .conf: containers-image ignores other files"
            )
        self.path = path
        self.registries_conf = registries_conf

    def existing(self) -> RegistriesConf:
        """registries.conf and the other drop-ins, as the runtime reads them without this one."""
        if self.registries_conf is None:
            return RegistriesConf()
        texts = registries_texts(self.registries_conf, self.path.parent)
        return read_registries_conf([t for t in texts if t[0] != self.path.name])

    def write(
        self, repositories: Iterable[str], mirror_host: str, *, tagged: Iterable[str] = ()
    ) -> bool:
        """Mirror ``repositories`` at ``mirror_host`` (``tagged``: those whose tags it serves
        too); return whether the file changed."""
        text = render_mirror_dropin(repositories, mirror_host, self.existing(), tagged=tagged)
        return write_atomic(self.path, text.encode())

    def remove(self) -> bool:
        """Remove the drop-in; return False if it was already gone."""
        return remove_file(self.path)
