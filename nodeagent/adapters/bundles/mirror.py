"""The bundle mirror's registries.conf.d drop-in on the host: write it, remove it.

The text comes from ``nodeagent.bundles.mirror.render_mirror_dropin``; this adapter
only puts it in place atomically (``nodeagent.adapters.files.write_atomic``:
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
from nodeagent.bundles.mirror import render_mirror_dropin
from nodeagent.errors import ConfigInvalid


class MirrorDropin:
    """nodeagent's one mirror drop-in at ``path`` (in the runtime's registries.conf.d)."""

    def __init__(self, path: Path) -> None:
        if path.suffix != ".conf":
            raise ConfigInvalid(
                f"mirror drop-in {path} must end in .conf: containers-image ignores other files"
            )
        self.path = path

    def write(self, repositories: Iterable[str], mirror_host: str) -> bool:
        """Mirror ``repositories`` at ``mirror_host``; return whether the file changed."""
        text = render_mirror_dropin(repositories, mirror_host)
        return write_atomic(self.path, text.encode())

    def remove(self) -> bool:
        """Remove the drop-in; return False if it was already gone."""
        return remove_file(self.path)
