"""Stall detection by the pull's staging files (docs/decisions/0005-stall-signal.md), with the
real daemon, CRI-O and registry, and another writer busy on the same filesystem.

The registry's blob answers stop mid-layer and hang (tests/testenv/faulty_proxy.py). Watching the
filesystem's used bytes, the busy writer would hide the stall until the 24 h backstop; the
staging files show it within the stall timeout.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.conftest import Pushed
from tests.testenv.agent import Agent, set_state, set_status
from tests.testenv.crio import Crio
from tests.testenv.faulty_proxy import FaultyProxy
from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.registry import Registry

pytestmark = pytest.mark.integration

MIB = 1024**2
STALL_TIMEOUT_S = 4.0


@contextmanager
def busy_writer(directory: Path) -> Iterator[list[int]]:
    """Appends 256 KiB every 50 ms (about 5 MB/s) to a file in ``directory``, like journald
    or pod logs on the same filesystem; yields the bytes written so far."""
    written = [0]
    stop = threading.Event()

    def write() -> None:
        chunk = os.urandom(256 * 1024)
        with (directory / "busy.log").open("wb") as file:
            while not stop.wait(0.05):
                if file.tell() > 32 * MIB:
                    file.seek(0)
                    file.truncate()
                file.write(chunk)
                file.flush()
                written[0] += len(chunk)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield written
    finally:
        stop.set()
        thread.join()


@pytest.mark.timeout(240)
async def test_a_stalled_pull_is_cut_within_the_timeout_while_another_writer_is_busy(
    registry: Registry, pushed: Pushed, tmp_path: Path
) -> None:
    image = TestImage("nodeagent-test/stall", [LayerSpec(16 * MIB, seed=4711)]).build()
    pushed_image = push(registry.url, image.repository, image)
    with (
        FaultyProxy(registry.host) as front,
        Crio(tmp_path / "crio", insecure_registries=[front.host]) as crio,
    ):
        ref = pushed_image.reference(front.host)
        assert crio.staging_dir.stat().st_dev == crio.storage_root.stat().st_dev
        agent = Agent(
            tmp_path / "agent",
            crio,
            pull_settings=f"stall_timeout_s = {STALL_TIMEOUT_S}\nattempts = 2",
        )
        agent.write_config()
        front.stall_bodies(after_bytes=4 * MIB)
        with busy_writer(crio.base) as written, agent:
            started = time.monotonic()
            agent.write_set("stalls", [ref])
            status = agent.wait_status(
                lambda s: (
                    bool((set_status(s, "stalls") or {}).get("failedImages"))
                    and "retryInSeconds" in s
                ),
                what="the stalled pull failed with a retry scheduled",
                timeout_s=120,
            )
            elapsed_s = time.monotonic() - started
            item = set_status(status, "stalls")
            assert item is not None
            assert item["failedImages"][0]["reason"] == "PullStalled"
            # Two attempts of 4 s each plus probe intervals and the backoff; far below what
            # the busy filesystem would have allowed (the 24 h backstop).
            assert elapsed_s < 4 * STALL_TIMEOUT_S + 10
            assert sum(e.fault == "stall" for e in front.exchanges()) >= 2
            assert written[0] > 5 * MIB  # the writer was busy all along
            front.heal()
            agent.wait_status(
                lambda s: set_state(s, "stalls") == "Pinned", what="pinned", timeout_s=90
            )
        async with CriClient(crio.endpoint) as cri:
            stored = await cri.image_status(ref)
        assert stored is not None and stored.is_pinned
        log = agent.log_text()
        assert log.count("pull_stalled") >= 2
        assert "reason=PullStalled" in log
