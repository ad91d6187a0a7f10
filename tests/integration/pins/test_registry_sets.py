"""``[store] registry_sets``: a registry set's blobs are fetched once into the node's store,
the runtime pulls them from there, and after its storage is lost they come back from the
store with the registry gone (real registry behind a counting proxy, real CRI-O, the real
daemon)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.conftest import Pushed
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.faulty_proxy import FaultyProxy

ON = "[store]\nregistry_sets = true\n"


async def pinned(crio: Crio, refs: list[str]) -> list[str]:
    async with CriClient(crio.endpoint) as cri:
        found = [await cri.image_status(ref) for ref in refs]
    return [ref for ref, image in zip(refs, found, strict=True) if image and image.is_pinned]


def set_record(agent: Agent, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        (agent.state_dir / "store" / "sets" / name / "record.json").read_text()
    )
    return doc


def stored_blobs(agent: Agent) -> set[str]:
    directory = agent.state_dir / "store" / "blobs" / "sha256"
    return {f"sha256:{p.name}" for p in directory.iterdir()} if directory.is_dir() else set()


def is_back(status: dict[str, Any], name: str, image_count: int) -> bool:
    loss = status.get("imageLoss") or {}
    return (
        set_state(status, name) == "Pinned"
        and loss.get("resolved") is True
        and loss.get("restoredFromStore") == image_count
    )


@pytest.mark.timeout(300)
async def test_a_registry_set_is_fetched_once_into_the_store_and_restored_with_the_registry_gone(
    pushed: Pushed, tmp_path: Path
) -> None:
    with FaultyProxy(pushed.host) as front:
        refs = [pushed.ref(i).replace(pushed.host, front.host) for i in (
            pushed.base_a, pushed.base_b, pushed.multiarch)]  # fmt: skip
        crio = Crio(tmp_path / "crio", insecure_registries=[front.host])
        with crio:
            agent = Agent(tmp_path / "agent", crio, extra_config=ON)
            agent.write_config()
            agent.write_set("apps", refs)
            with agent:
                agent.wait_status(lambda s: set_state(s, "apps") == "Pinned", what="apps pinned")
                assert await pinned(crio, refs) == refs
                record = set_record(agent, "apps")
                assert record["source"] == "registry"
                assert sorted(i["name"] for i in record["images"]) == sorted(refs)
                recorded = {b["digest"] for b in record["blobs"]}
                assert recorded <= stored_blobs(agent)
                fetches = front.blob_fetches()
                # every config and layer came through the registry exactly once (the shared
                # base layer too), by nodeagent: the runtime pulled from the store's mirror
                assert fetches, "nothing was fetched through the proxy"
                assert set(fetches) <= recorded
                assert set(fetches.values()) == {1}
                runtime_blob_gets = [
                    e for e in front.exchanges()
                    if e.request.is_blob and not e.request.is_from_nodeagent
                ]  # fmt: skip
                assert runtime_blob_gets == []
                index = json.loads((agent.state_dir / "store" / "index.json").read_text())
                named = {m["annotations"]["org.opencontainers.image.ref.name"] for m in index[
                    "manifests"]}  # fmt: skip
                assert named == set(refs)

                # the registry goes away; CRI-O loses its whole storage and starts again
                front.refuse()
                seen = len(front.exchanges())
                crio.kill()
                shutil.rmtree(crio.storage_root)
                crio.start()
                started_s = time.monotonic()
                agent.wait_status(
                    lambda s: is_back(s, "apps", len(refs)),
                    what="every image back from the local store",
                    timeout_s=120,
                )
                # noticed when CRI-O's socket appeared, not at the 10-minute resync
                assert time.monotonic() - started_s < 60
                assert await pinned(crio, refs) == refs
                assert len(front.exchanges()) == seen  # not one request reached the registry
                log = agent.current_run_log()
                assert "images_restored_from_store" in log
                assert "registry_set_not_stored" not in log


@pytest.mark.timeout(240)
async def test_without_the_option_nothing_of_a_registry_set_is_stored(
    pushed: Pushed, fresh_crio: Crio, tmp_path: Path
) -> None:
    refs = [pushed.ref(pushed.base_a)]
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.write_set("apps", refs)
    with agent:
        agent.wait_status(lambda s: set_state(s, "apps") == "Pinned", what="apps pinned")
    assert stored_blobs(agent) == set()
    assert not (agent.state_dir / "store" / "sets").exists()
    assert "registry_images_stored" not in agent.log_text()


@pytest.mark.timeout(240)
async def test_a_store_too_small_falls_back_to_the_registry_and_says_why(
    pushed: Pushed, fresh_crio: Crio, tmp_path: Path
) -> None:
    refs = [pushed.ref(pushed.base_a)]
    agent = Agent(tmp_path / "agent", fresh_crio, extra_config=ON + 'max_bytes = "4KiB"\n')
    agent.write_config()
    agent.write_set("apps", refs)
    with agent:
        agent.wait_status(lambda s: set_state(s, "apps") == "Pinned", what="apps pinned")
        assert await pinned(fresh_crio, refs) == refs
    log = agent.log_text()
    assert "registry_set_not_stored" in log
    assert "StoreFull" in log
    assert stored_blobs(agent) == set()
