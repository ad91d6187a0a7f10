"""The image filesystem's space, fixed by the test: a ``ports.SpaceProbe``.

The real probe is ``adapters.host.StatvfsSpace`` (statvfs); tests/integration/pins/
test_recovery.py runs admission against a real 48 MiB filesystem.
"""

from __future__ import annotations

from nodeagent.ports import FilesystemSpace


class FixedSpace:
    """``ports.SpaceProbe``: the same figures for any mountpoint; records what was asked."""

    def __init__(self, *, total_bytes: int, available_bytes: int) -> None:
        self.total_bytes = total_bytes
        self.available_bytes = available_bytes
        self.asked: list[str] = []

    def space(self, mountpoint: str) -> FilesystemSpace:
        self.asked.append(mountpoint)
        return FilesystemSpace(mountpoint, self.total_bytes, self.available_bytes)
