"""One node's pin path in process: the real Reconciler, ledger, reporter and spec files.

Real: ``Reconciler``, ``LedgerStore`` over ``JsonStateStore`` (files in a temp dir),
``Reporter`` (status.json, STATUS=), ``PinService``, ``PrePuller``, ``DiskAdmission``, the
spec loader reading real files. Stand-ins from tests/fakes: CRI-O (``FakeCrio``, its files
``MemoryDropins`` and reloader), registry manifests (``FakeManifests``), free space
(``FixedSpace``). Time is virtual: the pre-puller and pin verification sleep on a
``VirtualClock``, the sync loop waits on a ``LoopClock``. A ``Node`` made again over the
same directories and runtime is the daemon restarted.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.files import JsonStateStore
from nodeagent.disk import DiskAdmission, DiskPolicy
from nodeagent.errors import NodeAgentError
from nodeagent.pins import PinService
from nodeagent.prepull import PrePuller, PullPolicy
from nodeagent.reporting import Reporter
from nodeagent.specs import load_spec_dirs
from nodeagent.status import NodeStatus, SetStatus
from nodeagent.sync import Reconciler, SyncSchedule
from tests.fakes.clock import VirtualClock, run_inline
from tests.fakes.crio import FakeCrio, MemoryDropins
from tests.fakes.host import FixedSpace
from tests.fakes.registry import FakeManifests
from tests.fakes.reloader import RecordingReloader

GIB = 1024**3
MIB = 1024**2
BOOT = "boot-1"


def ref(name: str) -> str:
    return f"quay.io/ns/{name}@sha256:" + name[0] * 64


A, B, C, D = (ref(n) for n in ("app-a", "bpp-b", "cpp-c", "dpp-d"))


def set_yaml(name: str, *refs: str, generation: int | None = None) -> str:
    images = "".join(f"    - name: {r}\n" for r in refs)
    meta = f"  name: {name}\n" + (f"  generation: {generation}\n" if generation else "")
    return (
        "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\n"
        f"metadata:\n{meta}spec:\n  pinnedImages:\n{images}"
    )


class StatusLines:
    """``ports.StatusLine``: records every STATUS= line."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def status(self, text: str) -> None:
        self.sent.append(text)


class LoopClock:
    """The sync loop's ``monotonic`` and ``wait``: each wait advances virtual time by its
    timeout (or ends early when a sync was requested) and is recorded; ``between`` runs
    before each wait returns (the world changing between syncs); at ``park_after`` waits
    the loop parks and ``parked`` is set."""

    def __init__(self, park_after: int, between: Callable[[int], None] | None = None) -> None:
        self.now_s = 0.0
        self.waits: list[float] = []
        self.park_after = park_after
        self.between = between or (lambda _index: None)
        self.parked = asyncio.Event()

    def monotonic(self) -> float:
        return self.now_s

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        self.waits.append(timeout_s)
        if len(self.waits) >= self.park_after:
            self.parked.set()
            await asyncio.Event().wait()
        self.now_s += 0.0 if event.is_set() else timeout_s
        self.between(len(self.waits))
        await asyncio.sleep(0)


class Node:
    """One node: spec and state directories under ``base``, a runtime that may outlive it."""

    def __init__(
        self,
        base: Path,
        *,
        crio: FakeCrio | None = None,
        dropins: MemoryDropins | None = None,
        sizes: Mapping[str, int] | None = None,
        manifests: FakeManifests | None = None,
        available_bytes: int = 50 * GIB,
        failing: Mapping[str, Sequence[NodeAgentError | None]] | None = None,
        boot_id: str = BOOT,
        schedule: SyncSchedule | None = None,
        loop: LoopClock | None = None,
        attempts: int = 2,
    ) -> None:
        self.base = base
        self.spec_dir = base / "specs"
        self.state_dir = base / "state"
        self.spec_dir.mkdir(parents=True, exist_ok=True)
        self.failing = {r: list(script) for r, script in (failing or {}).items()}
        self.clock = VirtualClock()
        self.loop = loop or LoopClock(park_after=1)
        self.crio = crio or FakeCrio()
        self.crio.pull_handler = self._pull
        self.dropins = dropins or MemoryDropins()
        if crio is None:
            self.crio.start(self.dropins.texts_in_crio_order())
        self.reloader = RecordingReloader(self.dropins, self.crio)
        pins = PinService(
            self.dropins,
            self.reloader,
            self.crio,
            verify_timeout_s=20.0,
            sleep=self.clock.sleep,
            monotonic=self.clock.monotonic,
        )
        self.store = JsonStateStore(self.state_dir)
        self.lines = StatusLines()
        self.reporter = Reporter(line=self.lines, store=self.store)
        puller = PrePuller(
            self.crio,
            lambda _ref: None,
            PullPolicy(attempts=attempts, backoff_initial_s=1.0, jitter=0.0),
            on_event=self.reporter.pull_event,
            sleep=self.clock.sleep,
            monotonic=self.clock.monotonic,
            rand=lambda: 0.5,
            run_blocking=run_inline,
        )
        self.manifests = manifests or FakeManifests(sizes or dict.fromkeys((A, B, C, D), MIB))
        self.space = FixedSpace(total_bytes=100 * GIB, available_bytes=available_bytes)
        admission = DiskAdmission(
            runtime=self.crio,
            manifests=self.manifests,
            space=self.space,
            credentials_for=lambda _ref: None,
            policy=DiskPolicy(expansion_factor=2.0, reserve_bytes=1 * GIB),
        )
        self.reconciler = Reconciler(
            load_specs=lambda: load_spec_dirs([(self.spec_dir, True)]),
            runtime=self.crio,
            pins=pins,
            puller=puller,
            admission=admission,
            store=self.store,
            boot_id=boot_id,
            report=self.reporter,
            schedule=schedule,
            monotonic=self.loop.monotonic,
            wait=self.loop.wait,
        )

    async def _pull(self, image: str) -> None:
        await asyncio.sleep(0)
        script = self.failing.get(image)
        if script:
            error = script.pop(0)
            if error is not None:
                raise error

    # ---------------------------------------------------------------- specs
    def write_set(self, name: str, *refs: str, file: str | None = None, **kw: Any) -> Path:
        path = self.spec_dir / (file or f"{name}.yaml")
        path.write_text(set_yaml(name, *refs, **kw))
        return path

    def spec_file(self, name: str) -> Path:
        return self.spec_dir / name

    # ---------------------------------------------------------------- running
    async def sync(self) -> NodeStatus:
        """One sync, reported like the loop reports it (status.json written)."""
        self.reporter.sync_started()
        status = await self.reconciler.sync()
        self.reporter.sync_finished(status)
        return status

    async def run_until_parked(self) -> None:
        task = asyncio.create_task(self.reconciler.run())
        try:
            await asyncio.wait_for(self.loop.parked.wait(), 10)
        finally:
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    # ---------------------------------------------------------------- reading
    def state(self, name: str) -> dict[str, Any]:
        return dict(json.loads((self.state_dir / f"{name}.json").read_text()))

    def status_file(self) -> dict[str, Any]:
        return self.state("status")

    def pinned(self) -> set[str]:
        return {name for name, is_pinned in self.crio.pinned_names().items() if is_pinned}

    def damaged_copies(self, name: str) -> list[Path]:
        return sorted(self.state_dir.glob(f"{name}.json.damaged-*"))


def by_name(status: NodeStatus) -> dict[str, SetStatus]:
    return {s.name: s for s in status.sets}


def condition(status: NodeStatus, kind: str) -> tuple[bool, str]:
    found = next(c for c in status.conditions if c.type == kind)
    return found.is_true, found.reason
