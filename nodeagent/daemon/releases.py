"""The release bundles the store holds, read lazily (the composition root's one reader).

``LazyReleases`` is retirement's ``cluster.retiring.ReleaseStore`` and the reporter's
``releases_source`` (through ``releases.release_reports``); it loads the store's code only
once the store holds a bundle, so an idle node does not import it (decision 0069).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nodeagent.releases import HeldRelease

if TYPE_CHECKING:
    from nodeagent.adapters.store.releases import StoredReleases


class LazyReleases:
    """``StoredReleases`` once the store holds a bundle; before that, no release."""

    def __init__(self, store_dir: Path, spec_dirs: tuple[Path, ...]) -> None:
        self.store_dir = store_dir
        self.spec_dirs = spec_dirs
        self._built: StoredReleases | None = None

    def _store(self) -> StoredReleases | None:
        if self._built is None:
            try:
                if not any((self.store_dir / "bundles").iterdir()):
                    return None
            except FileNotFoundError:
                return None
            from nodeagent.adapters.store.releases import StoredReleases  # noqa: PLC0415

            self._built = StoredReleases(self.store_dir, self.spec_dirs)
        return self._built

    def held(self) -> tuple[HeldRelease, ...]:
        store = self._store()
        return () if store is None else store.held()

    def unpin(self, held: HeldRelease) -> list[Path]:
        store = self._store()
        return [] if store is None else store.unpin(held)
