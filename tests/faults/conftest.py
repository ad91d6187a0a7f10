"""Fixtures of the fault drills: a drilled node per test, and the images it pins.

Every drill gets its own CRI-O, daemon and faulty proxy (``make_node``); the registry
and the images in it are the session's. Markers (pyproject.toml): every drill is
``drill``; those that only ``make drills`` runs are ``drill_long`` as well (``make test``
deselects them: its addopts say ``-m "not drill_long"``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import pytest

from tests.faults.node import DROPIN, DrillNode, LinkWatch, NotifyListener
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.faulty_proxy import FaultyProxy
from tests.testenv.images import make_image_set, push
from tests.testenv.registry import Registry


@pytest.fixture(scope="session")
def drill_images(registry: Registry) -> list[str]:
    """Six images of 12 MiB (a 4 MiB base they share, 8 MiB of their own), by digest.

    Large enough that a throttled proxy holds each pull for seconds (a fault lands
    mid-pull), small enough that a drill pulls all of them in a few seconds unthrottled.
    """
    images = make_image_set(6, layer_size_bytes=8 << 20, shared_base_size_bytes=4 << 20, seed=1313)
    return [push(registry.url, i.repository, i.build()).reference(registry.host) for i in images]


class NodeFactory(Protocol):
    def __call__(
        self,
        *,
        storage_root: Path | None = None,
        pull_settings: str = "",
        extra_config: str = "",
        is_fast_retry: bool = True,
        watch_media: bool = False,
        insecure_registries: Sequence[str] = (),
    ) -> DrillNode: ...


@pytest.fixture
def make_node(tmp_path: Path, registry: Registry) -> Iterator[NodeFactory]:
    """Builds the drilled node: proxy and CRI-O started, the daemon configured, not started."""
    nodes: list[DrillNode] = []
    proxies: list[FaultyProxy] = []

    def make(
        *,
        storage_root: Path | None = None,
        pull_settings: str = "",
        extra_config: str = "",
        is_fast_retry: bool = True,
        watch_media: bool = False,
        insecure_registries: Sequence[str] = (),
    ) -> DrillNode:
        base = tmp_path / f"node{len(nodes)}"
        proxy = FaultyProxy(registry.host)
        proxy.start()
        proxies.append(proxy)
        crio = Crio(
            base / "crio",
            insecure_registries=[proxy.host, registry.host, *insecure_registries],
            storage_root=storage_root,
        )
        crio.start()
        agent = Agent(
            base / "agent",
            crio,
            pull_settings=pull_settings,
            extra_config=extra_config,
            is_fast_retry=is_fast_retry,
            watch_media=watch_media,
        )
        notify = NotifyListener(base / "notify.sock")
        agent.extra_env["NOTIFY_SOCKET"] = str(notify.path)
        agent.write_config()
        node = DrillNode(
            base=base,
            registry=registry,
            proxy=proxy,
            crio=crio,
            agent=agent,
            notify=notify,
            watch=LinkWatch(crio.dropin_dir / DROPIN, agent.transient_dropin_dir / DROPIN),
        )
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()
    for proxy in proxies:
        proxy.stop()


class DiskFactory(Protocol):
    def __call__(self, size_mib: int, *, at: Path | None = None) -> Path: ...


@pytest.fixture
def make_disk(tmp_path: Path) -> Iterator[DiskFactory]:
    """Small ext4 filesystems (no root reserve), loop-mounted; each call gives a mountpoint.

    A runtime's store goes in a directory below the mountpoint, so a drill can fill the
    same filesystem from beside it. ``at``: mounted there (made if missing; a node's
    ``var/lib``, say) instead of a directory of its own.
    """
    mounted: list[Path] = []

    def make(size_mib: int, *, at: Path | None = None) -> Path:
        image = tmp_path / f"disk{len(mounted)}.img"
        mountpoint = at or tmp_path / f"disk{len(mounted)}"
        mountpoint.mkdir(parents=True, exist_ok=at is not None)
        subprocess.run(["truncate", "-s", f"{size_mib}M", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)], check=True)
        mounted.append(mountpoint)
        return mountpoint

    yield make
    for mountpoint in mounted:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
