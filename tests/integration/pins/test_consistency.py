"""The node stays consistent through faults (issue 13), with the real daemon, CRI-O and
registry: a damaged ledger with a broken spec at boot, a spec file empty for a moment,
manifests the daemon cannot read on a small disk, a registry answering 5xx, CRI-O down.

Faults come from tests/testenv/faulty_proxy.py, a proxy in front of the real registry;
CRI-O reaches the registry only through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.conftest import Pushed
from tests.testenv.agent import Agent, set_state, set_status
from tests.testenv.crio import Crio
from tests.testenv.faulty_proxy import FaultyProxy, is_blob
from tests.testenv.registry import Registry, free_port

pytestmark = pytest.mark.integration


async def pinned(crio: Crio, refs: list[str]) -> list[str]:
    async with CriClient(crio.endpoint) as cri:
        found = [await cri.image_status(ref) for ref in refs]
    return [ref for ref, image in zip(refs, found, strict=True) if image and image.is_pinned]


async def stored(crio: Crio) -> int:
    async with CriClient(crio.endpoint) as cri:
        return len(await cri.list_images())


def condition(status: dict[str, Any], kind: str) -> tuple[str, str]:
    found = next(c for c in status["conditions"] if c["type"] == kind)
    return found["status"], found["reason"]


@pytest.fixture
def front(registry: Registry) -> Iterator[FaultyProxy]:
    with FaultyProxy(registry.host) as running:
        yield running


@pytest.fixture
def fronted_crio(tmp_path: Path, front: FaultyProxy) -> Iterator[Crio]:
    with Crio(tmp_path / "crio", insecure_registries=[front.host]) as running:
        yield running


# ---------------------------------------------------------------- damaged state at boot
@pytest.mark.timeout(180)
async def test_boot_pins_survive_a_damaged_ledger_and_a_broken_spec_then_the_daemon_rebuilds(
    fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    refs = [pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)]
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    spec = agent.write_set("keep", refs)
    with agent:
        agent.wait_status(lambda s: set_state(s, "keep") == "Pinned", what="keep pinned")
    fresh_crio.stop()
    # Power cut: the ledger is garbage, an editor left the spec half-saved, /run is empty.
    (agent.state_dir / "ledger.json").write_bytes(b"\xff\xfe\x00garbage")
    spec.write_text("apiVersion: machineconfiguration.openshift.io/v1\nkind: Pinned")
    target = agent.transient_dropin_dir / "99-nodeagent-pinned-images.conf"
    target.unlink()

    rendered = agent.cli("render-pins", "--write")  # ExecStartPre, before crio.service
    assert rendered.returncode == 0, rendered.stderr
    assert "state_file_damaged" in rendered.stderr
    assert "StateFileDamaged" in rendered.stderr
    assert all(ref in target.read_text() for ref in refs)
    assert not list(agent.state_dir.glob("ledger.json.damaged-*"))  # read-only at boot

    fresh_crio.start()  # CRI-O alone, from the rendered file
    assert await pinned(fresh_crio, refs) == refs

    with agent:
        status = agent.wait_status(
            lambda s: (set_status(s, "keep") or {}).get("reason") == "SpecInvalid",
            what="keep held at its last good generation",
        )
        item = set_status(status, "keep")
        assert item is not None
        assert (item["state"], item["currentGeneration"]) == ("Pinned", 1)
        assert [r["file"] for r in status["stateRepairs"]] == ["ledger"]
        assert condition(status, "Degraded") == ("True", "SpecInvalid")
        assert await pinned(fresh_crio, refs) == refs
    assert len(list(agent.state_dir.glob("ledger.json.damaged-*"))) == 1
    shown = agent.cli("status")
    assert "state rebuilt: ledger: StateFileDamaged" in shown.stdout


@pytest.mark.timeout(120)
async def test_a_spec_file_emptied_by_an_in_place_save_unpins_nothing(
    fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    refs = [pushed.ref(pushed.base_a)]
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    spec = agent.write_set("apps", refs)
    with agent:
        agent.wait_status(lambda s: set_state(s, "apps") == "Pinned", what="apps pinned")
        good = spec.read_text()
        spec.write_text("")  # the editor truncated the file ...
        agent.wait_log("set_held")
        assert await pinned(fresh_crio, refs) == refs
        spec.write_text(good)  # ... and wrote it again
        agent.wait_status(
            lambda s: (
                (set_status(s, "apps") or {}).get("reason") is None and not s.get("specProblems")
            ),
            what="apps back to normal",
        )
        assert await pinned(fresh_crio, refs) == refs
        assert "image_unpinned" not in agent.current_run_log()


# ---------------------------------------------------------------- registry faults
@pytest.mark.timeout(240)
async def test_unreadable_manifests_hold_the_set_instead_of_filling_a_small_disk(
    small_store: Path, registry: Registry, big_images: list[str], tmp_path: Path
) -> None:
    """The fault seen: manifests answering 500 counted as 0 B, a small store filled up."""
    with (
        FaultyProxy(registry.host) as front,
        Crio(tmp_path / "crio", insecure_registries=[front.host], storage_root=small_store) as crio,
    ):
        refs = [ref.replace(registry.host, front.host) for ref in big_images[:3]]
        front.answer_errors(500, match=lambda r: r.is_from_nodeagent)  # CRI-O's pulls would work
        agent = Agent(tmp_path / "agent", crio)
        agent.write_config()
        agent.write_set("big", refs)
        with agent:
            status = agent.wait_status(
                lambda s: (
                    (set_status(s, "big") or {}).get("reason") == "SizeUnknown"
                    and "retryInSeconds" in s
                ),
                what="big held for its unknown size, a retry scheduled",
            )
            item = set_status(status, "big")
            assert item is not None
            assert {f["reason"] for f in item["failedImages"]} == {"RegistryError"}
            assert 0 < status["retryInSeconds"] <= 60
            assert await stored(crio) == 0
            front.heal()  # sized now: too big for 48 MiB, refused
            status = agent.wait_status(
                lambda s: set_state(s, "big") == "Refused", what="big refused", timeout_s=90
            )
        assert await stored(crio) == 0
        log = agent.log_text()
        assert "disk_admission" in log
        assert "disk_size_unknown" in log
        assert "NoSpaceLeft" not in log
        assert "image_pulled" not in log


@pytest.mark.timeout(240)
async def test_blobs_answering_500_are_a_registry_error_retried_within_seconds(
    fronted_crio: Crio, front: FaultyProxy, pushed: Pushed, tmp_path: Path
) -> None:
    refs = [pushed.base_a.reference(front.host)]
    front.answer_errors(500, match=is_blob)
    agent = Agent(tmp_path / "agent", fronted_crio, pull_settings="attempts = 1")
    agent.write_config()
    agent.write_set("apps", refs)
    with agent:
        status = agent.wait_status(
            lambda s: (
                (set_status(s, "apps") or {}).get("reason") == "RegistryError"
                and "retryInSeconds" in s
            ),
            what="apps failing with RegistryError, a retry scheduled",
        )
        item = set_status(status, "apps")
        assert item is not None
        assert item["failedImages"][0]["reason"] == "RegistryError"
        assert condition(status, "Degraded") == ("True", "RegistryError")
        assert 0 < status["retryInSeconds"] <= 60
        agent.wait_log("sync_retry_scheduled")
        front.heal()
        agent.wait_status(
            lambda s: set_state(s, "apps") == "Pinned", what="apps pinned", timeout_s=90
        )
    assert await pinned(fronted_crio, refs) == refs
    assert "RuntimeCallFailed" not in agent.log_text()


@pytest.mark.timeout(240)
async def test_a_registry_outage_is_waited_out_without_the_resync(
    fronted_crio: Crio, front: FaultyProxy, pushed: Pushed, tmp_path: Path
) -> None:
    refs = [pushed.base_b.reference(front.host)]
    front.refuse()
    agent = Agent(tmp_path / "agent", fronted_crio)
    agent.write_config()
    agent.write_set("apps", refs)
    with agent:
        status = agent.wait_status(
            lambda s: bool((set_status(s, "apps") or {}).get("failedImages")),
            what="apps waiting on the registry",
        )
        item = set_status(status, "apps")
        assert item is not None
        assert item["failedImages"][0]["reason"] == "RegistryUnavailable"
        front.heal()
        agent.wait_status(
            lambda s: set_state(s, "apps") == "Pinned", what="apps pinned", timeout_s=90
        )
    assert await pinned(fronted_crio, refs) == refs


@pytest.mark.timeout(180)
async def test_a_disconnected_site_sizes_its_images_through_the_registries_conf_mirror(
    registry: Registry, pushed: Pushed, tmp_path: Path
) -> None:
    """The images keep a name whose registry is out of reach; registries.conf mirrors it.
    CRI-O pulls from the mirror, and admission must size from there too, or the set would be
    held for ever (an unknown size never counts as zero)."""
    dead = f"127.0.0.1:{free_port()}"
    refs = [f"{dead}/{image.repository}@{image.digest}" for image in (pushed.base_a, pushed.base_b)]
    crio = Crio(tmp_path / "crio", insecure_registries=[registry.host, dead])
    crio.write_files()
    (crio.registries_dir / "50-mirror.conf").write_text(
        f'[[registry]]\nlocation = "{dead}"\ninsecure = true\n'
        f'[[registry.mirror]]\nlocation = "{registry.host}"\ninsecure = true\n'
    )
    with crio:
        agent = Agent(tmp_path / "agent", crio)
        agent.write_config()
        agent.write_set("mirrored", refs)
        with agent:
            agent.wait_status(lambda s: set_state(s, "mirrored") == "Pinned", what="pinned")
        assert await pinned(crio, refs) == refs
    log = agent.log_text()
    assert "disk_admitted" in log
    assert "SizeUnknown" not in log


# ---------------------------------------------------------------- CRI-O down mid-pull
@pytest.mark.timeout(240)
async def test_while_crio_is_down_mid_pull_the_status_says_so(
    fresh_crio: Crio, big_images: list[str], tmp_path: Path
) -> None:
    agent = Agent(tmp_path / "agent", fresh_crio, pull_settings="concurrency = 1")
    agent.write_config()
    agent.write_set("big", big_images)
    with agent:
        agent.wait_log("image_pulled")
        fresh_crio.stop()
        status = agent.wait_status(
            lambda s: condition(s, "Degraded") == ("True", "RuntimeUnreachable"),
            what="the status naming the runtime down",
        )
        assert condition(status, "Ready") == ("False", "RuntimeUnreachable")
        fresh_crio.start()
        agent.wait_status(lambda s: set_state(s, "big") == "Pinned", what="big pinned")
    assert "pulls_waiting" in agent.log_text()
