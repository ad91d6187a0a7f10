"""nodeagent run on one node, no cluster: local specs -> pulls -> pins, against real CRI-O."""

from __future__ import annotations

import asyncio
import time
import tomllib
from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.conftest import Pushed
from tests.testenv.agent import Agent, pinned_image_set_yaml, set_state, set_status
from tests.testenv.crio import Crio
from tests.testenv.registry import free_port


async def pinned_flags(crio: Crio, refs: list[str]) -> dict[str, bool | None]:
    async with CriClient(crio.endpoint) as cri:
        flags: dict[str, bool | None] = {}
        for ref in refs:
            image = await cri.image_status(ref)
            flags[ref] = None if image is None else image.is_pinned
        return flags


async def test_set_is_pulled_pinned_then_unpinned_on_removal(
    fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    refs = [pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)]
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    spec = agent.write_set("apps", refs)
    with agent:
        status = agent.wait_status(lambda s: set_state(s, "apps") == "Pinned", what="apps pinned")
        assert await pinned_flags(fresh_crio, refs) == dict.fromkeys(refs, True)
        item = set_status(status, "apps")
        assert item is not None
        assert item["images"] == {"total": 2, "present": 2, "pinned": 2, "failed": 0}
        assert item["desiredGeneration"] == item["currentGeneration"] == 1
        link = fresh_crio.dropin_dir / "99-nodeagent-pinned-images.conf"
        assert link.is_symlink()
        assert link.resolve() == (agent.transient_dropin_dir / link.name).resolve()
        pins = tomllib.loads(link.read_text())["crio"]["image"]["pinned_images"]
        assert sorted(refs) == [p for p in pins if p in refs]
        assert "reload=sighup" in agent.log_text()

        shown = agent.cli("status")
        assert shown.returncode == 0, shown.stderr
        assert "set apps: Pinned" in shown.stdout

        spec.unlink()
        agent.wait_status(lambda s: set_status(s, "apps") is None, what="apps gone from status")
        assert await pinned_flags(fresh_crio, refs) == dict.fromkeys(refs, False)
    assert agent.process is None


async def test_other_dropins_pins_survive_ours(
    fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    mine, theirs = pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)
    async with CriClient(fresh_crio.endpoint) as cri:
        await cri.pull_image(theirs)
    other = fresh_crio.dropin_dir / "50-pinned-images"
    other.write_text(f'[crio.image]\npinned_images = ["{theirs}"]\n')
    fresh_crio.reload()
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.write_set("mine", [mine])
    with agent:
        agent.wait_status(lambda s: set_state(s, "mine") == "Pinned", what="mine pinned")
        assert await pinned_flags(fresh_crio, [mine, theirs]) == {mine: True, theirs: True}

        # The other component drops its pin: nodeagent re-renders and CRI-O unpins it.
        other.write_text("[crio.image]\npinned_images = []\n")
        agent.wait_log("files_changed")
        assert await _wait_flag(fresh_crio, theirs, expected=False)
        assert (await pinned_flags(fresh_crio, [mine]))[mine] is True


async def _wait_flag(crio: Crio, ref: str, *, expected: bool, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (await pinned_flags(crio, [ref]))[ref] is expected:
            return True
        await asyncio.sleep(0.2)
    return False


async def test_tag_reference_rejected_while_valid_set_proceeds(
    fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    good = pushed.ref(pushed.base_a)
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    bad_ref = f"{pushed.host}/nodeagent-test/app-a:latest"
    (agent.persistent_dir / "mixed.yaml").write_text(
        pinned_image_set_yaml("bad", [bad_ref]) + "---\n" + pinned_image_set_yaml("good", [good])
    )
    checked = agent.cli("check-config")
    assert checked.returncode == 65
    assert "ImageReferenceInvalid" in checked.stderr
    assert "mixed.yaml" in checked.stderr
    assert "bad" in checked.stderr
    assert "set good: ok" in checked.stdout
    with agent:
        status = agent.wait_status(lambda s: set_state(s, "good") == "Pinned", what="good pinned")
        problems = status["specProblems"]
        assert [p["reason"] for p in problems] == ["ImageReferenceInvalid"]
        assert problems[0]["set"] == "bad"
        assert bad_ref in problems[0]["message"]
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert degraded["status"] == "True"
        assert degraded["reason"] == "SpecInvalid"
    assert "spec_rejected" in agent.log_text()


@pytest.mark.timeout(150)  # 21 s here: the pull retries with their backoff, then fails
async def test_unreachable_image_fails_alone_after_retries(
    fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    good = pushed.ref(pushed.base_a)
    # A loopback port nobody listens on: every pull attempt is refused.
    dead = f"127.0.0.1:{free_port()}/nodeagent-test/gone@sha256:" + "1" * 64
    agent = Agent(tmp_path / "agent", fresh_crio, extra_config="")
    agent.write_config()
    agent.write_set("fine", [good])
    agent.write_set("broken", [good, dead])
    with agent:
        status = agent.wait_status(
            lambda s: (
                set_state(s, "broken") == "Degraded"
                and set_state(s, "fine") == "Pinned"
                and "retryInSeconds" in s
            ),
            what="broken degraded and fine pinned",
        )
    broken = set_status(status, "broken")
    assert broken is not None
    assert [f["image"] for f in broken["failedImages"]] == [dead]
    assert broken["failedImages"][0]["reason"] == "RegistryUnavailable"
    # Its size cannot be learned either: the set is held, nothing of it pulled, and retried
    # within seconds (an unknown size never counts as zero).
    assert broken["reason"] == "SizeUnknown"
    assert broken["lastFailedGeneration"] == 1
    assert "currentGeneration" not in broken
    assert 0 < status["retryInSeconds"] <= 60
    log = agent.log_text()
    assert f"pull_retrying: image={dead}" not in log
    assert f"pull_failed: image={dead}" not in log
    assert "disk_size_unknown: set=broken" in log
