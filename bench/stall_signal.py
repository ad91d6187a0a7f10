"""Which signal tells a stalled pull from a slow one? Measurements for decision 0005.

A real registry behind tests/testenv/faulty_proxy.py, whose blob answers stop after some bytes
and hang; a fresh CRI-O 1.34.0 for each run; and a busy writer on the same filesystem
(appending 256 KiB every 50 ms, about 5 MB/s, truncated at 32 MiB: what journald or
chatty pod logs do). For each signal, the time from the pull's start to its
cancellation, with and without the writer:

* ``fs-used``: bytes used on the filesystems of the staging directory and the image
  store (statvfs), the signal nodeagent used before: any change is progress;
* ``staging``: names and sizes of containers/image's staging files
  (``adapters.host.StagingProbe``), nodeagent's signal now;
* ``crio-ppt``: CRI-O's own ``pull_progress_timeout`` (no nodeagent detector).

Stalls: ``mid-layer`` (the layer's body stops after 8 MiB) and ``first-blob`` (the first
blob's body never starts: the config, before any layer). Then a healthy pull of one
256 MiB layer with the writer busy: the longest time the staging files did not change
(the extraction of the layer into the store, after its download), which a stall timeout
must exceed, and whether CRI-O's own timeout let the healthy pull finish.

Run as root (CRI-O): ``.venv/bin/python -m bench.stall_signal [--timeout-s 10] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.host import StagingProbe
from nodeagent.prepull import PrePuller, ProgressProbe, PullPolicy
from tests.testenv.crio import Crio
from tests.testenv.faulty_proxy import FaultyProxy
from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.registry import Registry

MIB = 1024**2


class FsUsedProbe:
    """The old signal: bytes used on the filesystems of the given paths (statvfs)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def progress_mark(self) -> int:
        seen: set[int] = set()
        used = 0
        for path in self.paths:
            device = path.stat().st_dev
            if device not in seen:
                seen.add(device)
                vfs = os.statvfs(path)
                used += (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        return used


@contextmanager
def busy_writer(directory: Path, is_on: bool) -> Iterator[None]:
    stop = threading.Event()

    def write() -> None:
        path = directory / "busy.log"
        chunk = os.urandom(256 * 1024)
        with path.open("wb") as file:
            while not stop.wait(0.05):
                if file.tell() > 32 * MIB:
                    file.seek(0)
                    file.truncate()
                file.write(chunk)
                file.flush()
                os.fsync(file.fileno())

    thread = threading.Thread(target=write, daemon=True)
    if is_on:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if is_on:
            thread.join()


@dataclass
class Run:
    signal: str
    stall: str
    writer: bool
    outcome: str
    seconds: float


async def pull_once(
    crio: Crio, ref: str, probe: ProgressProbe | None, timeout_s: float, limit_s: float
) -> tuple[str, float]:
    policy = PullPolicy(attempts=1, stall_timeout_s=timeout_s, jitter=0.0)
    started = time.monotonic()
    async with CriClient(crio.endpoint, timeout_s=30) as cri:
        puller = PrePuller(cri, lambda _ref: None, policy, probe)
        try:
            results = await asyncio.wait_for(puller.pull_all([ref]), limit_s)
        except TimeoutError:
            return f"not detected in {limit_s:.0f} s", time.monotonic() - started
    result = results[ref]
    outcome = "pulled" if result.is_pulled else f"{result.reason}: {(result.message or '')[:70]}"
    return outcome, time.monotonic() - started


def probe_for(signal: str, crio: Crio) -> ProgressProbe | None:
    if signal == "fs-used":
        return FsUsedProbe([crio.staging_dir, crio.storage_root])
    if signal == "staging":
        return StagingProbe(lambda: [crio.staging_dir])
    return None


async def stall_runs(
    base: Path, registry: Registry, front: FaultyProxy, timeout_s: float
) -> list[Run]:
    runs: list[Run] = []
    seed = 1000
    for signal in ("fs-used", "staging", "crio-ppt"):
        for stall, after in (("mid-layer", 8 * MIB), ("first-blob", 0)):
            for writer in (False, True):
                seed += 1
                image = TestImage(f"stall/i{seed}", [LayerSpec(32 * MIB, seed=seed)]).build()
                ref = push(registry.url, image.repository, image).reference(front.host)
                ppt = f'pull_progress_timeout = "{timeout_s:.0f}s"' if signal == "crio-ppt" else ""
                work = base / f"run-{seed}"
                with Crio(
                    work / "crio", insecure_registries=[front.host], image_settings=ppt
                ) as crio:
                    front.stall_bodies(after_bytes=after)
                    with busy_writer(work / "crio", writer):
                        outcome, seconds = await pull_once(
                            crio, ref, probe_for(signal, crio), timeout_s, timeout_s * 4
                        )
                    front.heal()
                runs.append(Run(signal, stall, writer, outcome, round(seconds, 1)))
                print(runs[-1], flush=True)
    return runs


@dataclass
class Healthy:
    signal: str
    layer_mib: int
    outcome: str
    pull_s: float
    longest_unchanged_s: float


async def healthy_run(
    base: Path, registry: Registry, front: FaultyProxy, timeout_s: float, signal: str
) -> Healthy:
    image = TestImage(f"stall/big-{signal}", [LayerSpec(256 * MIB, seed=77)]).build()
    ref = push(registry.url, image.repository, image).reference(front.host)
    ppt = f'pull_progress_timeout = "{timeout_s:.0f}s"' if signal == "crio-ppt" else ""
    with Crio(
        base / f"healthy-{signal}" / "crio", insecure_registries=[front.host], image_settings=ppt
    ) as crio:
        staging = StagingProbe(lambda: [crio.staging_dir])
        gap = longest_gap(staging.progress_mark)
        with busy_writer(crio.base, True), gap:
            outcome, seconds = await pull_once(crio, ref, None, timeout_s, 600)
    return Healthy(signal, 256, outcome, round(seconds, 1), round(gap.longest_s, 1))


class longest_gap:
    """Samples ``mark`` every 0.1 s in a thread; the longest time it did not change."""

    def __init__(self, mark: Callable[[], int]) -> None:
        self.mark = mark
        self.longest_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        last, since = self.mark(), time.monotonic()
        while not self._stop.wait(0.1):
            now, mark = time.monotonic(), self.mark()
            if mark != last:
                last, since = mark, now
            self.longest_s = max(self.longest_s, now - since)

    def __enter__(self) -> None:
        self._thread.start()

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stall-signal-", dir="/var/tmp") as tmp:
        base = Path(tmp)
        with Registry(base / "registry") as registry, FaultyProxy(registry.host) as front:
            runs = await stall_runs(base, registry, front, args.timeout_s)
            healthy = [
                await healthy_run(base, registry, front, args.timeout_s, signal)
                for signal in ("staging", "crio-ppt")
            ]
    if args.json:
        print(
            json.dumps(
                {"stalls": [asdict(r) for r in runs], "healthy": [asdict(h) for h in healthy]},
                indent=2,
            )
        )
        return
    print(f"\nstall timeout {args.timeout_s:.0f} s")
    print(f"{'signal':<9} {'stall':<11} {'writer':<7} {'seconds':>8}  outcome")
    for r in runs:
        print(f"{r.signal:<9} {r.stall:<11} {r.writer!s:<7} {r.seconds:>8}  {r.outcome}")
    for h in healthy:
        print(
            f"healthy {h.layer_mib} MiB layer, writer busy, {h.signal}: {h.outcome} in "
            f"{h.pull_s} s; staging files unchanged at most {h.longest_unchanged_s} s"
        )


if __name__ == "__main__":
    asyncio.run(main())
