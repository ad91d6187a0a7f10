"""Disk admission on a small filesystem, and recovery from a killed daemon or runtime."""

from __future__ import annotations

import re
from pathlib import Path

from nodeagent.adapters.cri.client import CriClient
from tests.testenv.agent import Agent, set_state, set_status
from tests.testenv.crio import Crio
from tests.testenv.registry import Registry


async def present(crio: Crio, refs: list[str]) -> list[str]:
    async with CriClient(crio.endpoint) as cri:
        return [ref for ref in refs if await cri.image_status(ref) is not None]


async def pinned(crio: Crio, refs: list[str]) -> list[str]:
    async with CriClient(crio.endpoint) as cri:
        found = [await cri.image_status(ref) for ref in refs]
    return [ref for ref, image in zip(refs, found, strict=True) if image and image.is_pinned]


async def test_too_small_storage_is_refused_before_any_pull(
    small_store: Path, registry: Registry, big_images: list[str], tmp_path: Path
) -> None:
    refs = big_images[:2]
    with Crio(
        tmp_path / "crio", insecure_registries=[registry.host], storage_root=small_store
    ) as crio:
        agent = Agent(tmp_path / "agent", crio)
        agent.write_config()
        agent.write_set("big", refs)
        with agent:
            # The first status that says Refused (the interim one too) gives the reason.
            status = agent.wait_status(lambda s: set_state(s, "big") == "Refused", what="refusal")
        assert await present(crio, refs) == []
    item = set_status(status, "big")
    assert item is not None
    assert item["reason"] == "InsufficientDiskSpace"
    message = item["lastFailedGenerationError"]
    assert re.search(r"needs [\d.]+ MiB, [\d.]+ MiB available on the image filesystem", message)
    assert "must stay free" in message
    assert status["disk"]["mountpoint"].startswith(str(small_store))
    log = agent.log_text()
    assert "disk_refused" in log
    assert "pull_started" not in log
    assert "image_pulled" not in log


async def test_daemon_killed_mid_sync_resumes_without_redoing(
    fresh_crio: Crio, big_images: list[str], tmp_path: Path
) -> None:
    agent = Agent(tmp_path / "agent", fresh_crio, pull_settings="concurrency = 1")
    agent.write_config()
    agent.write_set("big", big_images)
    agent.start()
    agent.wait_log("image_pulled")
    agent.kill()
    done = await present(fresh_crio, big_images)
    assert 0 < len(done) < len(big_images)

    with agent:
        agent.wait_status(lambda s: set_state(s, "big") == "Pinned", what="big pinned")
    second = agent.current_run_log()
    started = re.search(r"pulls_started: images=(\d+)", second)
    assert started is not None
    assert int(started[1]) == len(big_images) - len(done)
    for ref in done:
        assert f"image_pulled: image={ref}" not in second
    assert await pinned(fresh_crio, big_images) == big_images


async def test_runtime_restarted_mid_sync_recovers(
    fresh_crio: Crio, big_images: list[str], tmp_path: Path
) -> None:
    agent = Agent(tmp_path / "agent", fresh_crio, pull_settings="concurrency = 1")
    agent.write_config()
    agent.write_set("big", big_images)
    with agent:
        agent.wait_log("image_pulled")
        fresh_crio.stop()
        agent.wait_log("reason=RuntimeUnreachable")
        fresh_crio.start()
        status = agent.wait_status(lambda s: set_state(s, "big") == "Pinned", what="big pinned")
    item = set_status(status, "big")
    assert item is not None
    assert item["images"]["pinned"] == len(big_images)
    assert "failedImages" not in item
    assert await pinned(fresh_crio, big_images) == big_images


async def test_render_pins_at_boot_restores_persistent_pins_before_runtime_starts(
    fresh_crio: Crio, big_images: list[str], tmp_path: Path
) -> None:
    refs = big_images[:2]
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.write_set("keep", refs)
    with agent:
        agent.wait_status(lambda s: set_state(s, "keep") == "Pinned", what="keep pinned")
    fresh_crio.stop()
    # A reboot empties /run: the pin file is gone, the link in CRI-O's config dir stays.
    target = agent.transient_dropin_dir / "99-nodeagent-pinned-images.conf"
    target.unlink()
    assert (fresh_crio.dropin_dir / target.name).is_symlink()

    rendered = agent.cli("render-pins", "--write")  # ExecStartPre, before crio.service
    assert rendered.returncode == 0, rendered.stderr
    assert all(ref in target.read_text() for ref in refs)

    fresh_crio.start()  # no nodeagent daemon running: CRI-O alone must report the pins
    assert await pinned(fresh_crio, refs) == refs
