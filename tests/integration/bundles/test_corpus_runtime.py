"""A sample of the malicious-bundle corpus against a real CRI-O, and through the real daemon.

- ``nodeagent bundle import`` (the daemon's importer and adapters, a subprocess) against a
  CRI-O of this module's own: the flaw only a pull finds (a damaged layer, hashed as it is
  served), and a few found before any pull; then the good bundle, which imports.
- The daemon watching udev: malicious bundles on ext4 loop devices (with the lost+found
  every ext4 medium has) are refused one after the other, then the good one is imported.

The images' registry (``bundle_corpus.HOST``) does not answer: only the bundle has them.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.registries import node_platform
from tests.testenv.agent import Agent
from tests.testenv.bundle_corpus import CorpusKeys, Draft, good_draft, make_keys
from tests.testenv.bundle_flaws import CASES
from tests.testenv.bundles import ext4_media
from tests.testenv.crio import Crio
from tests.testenv.udev import LoopMedia, Udevd

pytestmark = pytest.mark.integration

PLATFORM = node_platform(os.uname().machine)
RUNTIME_CASES = [
    "flipped byte in the shared base layer",
    "set name x/../../outside",
    "legacy (non-prehashed) signature by a trusted key",
    "layer not in the bundle",
    "10 MB bundleId",
]
DAEMON_CASES = [
    "set name x/../../outside",
    "file inside lost+found",
    "legacy (non-prehashed) signature by a trusted key",
]
MIRROR = "99-nodeagent-bundle-mirror.conf"


@pytest.fixture(scope="module")
def keys() -> CorpusKeys:
    return make_keys()


@pytest.fixture(scope="module")
def good() -> Draft:
    return good_draft(PLATFORM)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crio]:
    with Crio(tmp_path_factory.mktemp("corpus-crio")) as crio:
        yield crio


def refs_of(draft: Draft) -> list[str]:
    return [str(image["name"]) for image in draft.doc["images"]]


async def stored(crio: Crio, refs: list[str]) -> list[str]:
    async with CriClient(crio.endpoint) as cri:
        return [ref for ref in refs if await cri.image_status(ref) is not None]


async def pinned(crio: Crio, refs: list[str]) -> list[str]:
    async with CriClient(crio.endpoint) as cri:
        found = [await cri.image_status(ref) for ref in refs]
    return [ref for ref, image in zip(refs, found, strict=True) if image and image.is_pinned]


def agent_for(base: Path, crio: Crio, keys: CorpusKeys, **kwargs: Any) -> Agent:
    agent = Agent(base, crio, **kwargs)
    agent.write_config()
    keys.install(agent.trusted_keys_dir)
    return agent


def import_report(agent: Agent, root: Path) -> tuple[int, dict[str, Any]]:
    done = agent.cli("bundle", "import", str(root), "--json")
    text = done.stdout
    return done.returncode, json.loads(text[text.index("{") :])


def spec_files(agent: Agent) -> list[Path]:
    return [*agent.persistent_dir.iterdir(), *agent.transient_dir.iterdir()]


# ---------------------------------------------------------------- bundle import, real CRI-O
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", RUNTIME_CASES)
async def test_refused_by_the_import_against_a_real_runtime(
    name: str, good: Draft, keys: CorpusKeys, runtime: Crio, tmp_path: Path
) -> None:
    assert await stored(runtime, refs_of(good)) == []  # the good bundle's test runs last
    case = CASES[name]
    draft = good.copy()
    case.flaw(draft)
    root = draft.write(tmp_path / "bundle", keys)
    agent = agent_for(tmp_path / "agent", runtime, keys)

    code, report = import_report(agent, root)

    assert (code, report["state"], report["reason"]) == (65, "rejected", case.reason), report
    assert len(report["message"]) < 1500
    assert spec_files(agent) == []
    assert not (runtime.registries_dir / MIRROR).exists()
    assert await stored(runtime, refs_of(good)) == []
    if case.stage == "serve":  # the pull started: the server saw the blob fail
        assert report["bytes"]["served"] < sum(b["sizeBytes"] for b in draft.doc["blobs"])


@pytest.mark.timeout(120)
async def test_the_good_bundle_imports_and_pins_against_the_same_runtime(
    good: Draft, keys: CorpusKeys, runtime: Crio, tmp_path: Path
) -> None:
    root = good.write(tmp_path / "bundle", keys)
    agent = agent_for(tmp_path / "agent", runtime, keys)
    code, report = import_report(agent, root)
    assert (code, report["state"]) == (0, "imported"), report
    assert await pinned(runtime, refs_of(good)) == refs_of(good)
    assert [p.name for p in spec_files(agent)] == ["bundle-corpus-good-corpus-apps.yaml"]
    assert not (runtime.registries_dir / MIRROR).exists()


# ---------------------------------------------------------------- the daemon, udev, ext4 media
@pytest.fixture(scope="module")
def udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        yield daemon


@pytest.fixture
def attached() -> Iterator[list[LoopMedia]]:
    media: list[LoopMedia] = []
    yield media
    for medium in media:
        if medium.devnode is not None:
            subprocess.run(["umount", "--lazy", medium.devnode], check=False)
            medium.detach()


def bundle_report(status: dict[str, Any], source: str | None) -> dict[str, Any] | None:
    found = [b for b in status.get("bundles", []) if b["source"] == source]
    return found[-1] if found else None


def in_state(source: str, state: str) -> Callable[[dict[str, Any]], bool]:
    return lambda status: (bundle_report(status, source) or {}).get("state") == state


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("udevd")
async def test_the_daemon_refuses_malicious_media_then_imports_a_good_one(
    good: Draft,
    keys: CorpusKeys,
    fresh_crio: Crio,
    tmp_path: Path,
    attached: list[LoopMedia],
) -> None:
    agent = agent_for(tmp_path / "agent", fresh_crio, keys, watch_media=True)
    with agent:
        agent.wait_log("daemon_started")
        for number, name in enumerate(DAEMON_CASES):
            draft = good.copy()
            CASES[name].flaw(draft)
            (tmp_path / str(number)).mkdir()
            medium = ext4_media(tmp_path / str(number), draft.write(tmp_path / f"b{number}", keys))
            attached.append(medium)
            source = medium.attach()
            status = agent.wait_status(in_state(source, "rejected"), what=f"{name}: refused")
            report = bundle_report(status, source) or {}
            assert report["reason"] == CASES[name].reason, report
            assert spec_files(agent) == []
            assert not (fresh_crio.registries_dir / MIRROR).exists()

        assert await stored(fresh_crio, refs_of(good)) == []
        (tmp_path / "good").mkdir()
        medium = ext4_media(tmp_path / "good", good.write(tmp_path / "good-bundle", keys))
        attached.append(medium)
        source = medium.attach()  # mkfs.ext4 made a lost+found: empty, it is ignored
        agent.wait_status(in_state(source, "pinned"), what="the good bundle pinned")
        assert agent.process is not None and agent.process.poll() is None
    assert await pinned(fresh_crio, refs_of(good)) == refs_of(good)
