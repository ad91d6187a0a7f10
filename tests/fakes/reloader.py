"""A ``pins.Reloader`` that makes the in-memory CRI-O re-read its in-memory files."""

from __future__ import annotations

from nodeagent.errors import RuntimeReloadFailed
from tests.fakes.crio import FakeCrio, MemoryDropins


class RecordingReloader:
    """``pins.Reloader``: counts reloads and makes the fake runtime re-read its files."""

    def __init__(self, store: MemoryDropins, runtime: FakeCrio, *, failures: int = 0) -> None:
        self.store = store
        self.runtime = runtime
        self.failures = failures
        self.calls = 0

    async def reload(self) -> str:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeReloadFailed("crio.service: reload job failed")
        self.runtime.reload(self.store.texts_in_crio_order())
        return "sighup"
