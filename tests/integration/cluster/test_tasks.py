"""The status object gets its Node owner reference once the Node is known, whatever the timing.

nodeagent may write its NodeImageStatus before its Node informer has listed (the Node's uid
unknown: no ownerReferences) and applies the object again once the uid is known. These tests
run the real ``StatusReporter`` against the session's API server with a kubelet's identity.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.kube import KubeApi
from nodeagent.cluster.reporter import StatusReporter
from nodeagent.cluster.tasks import Connection
from nodeagent.config import ClusterSettings, Config
from nodeagent.status import NodeStatus, PullProgress, conditions_for
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import get, install_deploy
from tests.testenv.waiting import wait_for_async

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> KubeCluster:
    install_deploy(kube)
    return kube


@dataclasses.dataclass
class Reporting:
    reporter: StatusReporter
    node: dict[str, Any]
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.reporter.run())


@pytest.fixture
async def reporting(
    cluster: KubeCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Reporting]:
    """A StatusReporter for a new Node (named after the test) with a status to write."""
    name = "owner-" + request.node.name.removeprefix("test_").replace("_", "-")[:30].rstrip("-")
    node = cluster.create_node(name)
    settings = ClusterSettings(
        enabled=True,
        kubeconfig=cluster.kubeconfig_for_node(name),
        node_name=name,
        status_interval_s=0.2,
        events=False,
        request_timeout_s=10,
    )
    config = dataclasses.replace(Config.default(root=tmp_path), cluster=settings)
    api = KubeApi(settings.kubeconfig, timeout_s=10, field_manager="nodeagent")
    reporter = StatusReporter(config, api, Connection(api.server), progress=PullProgress)
    reporter.update(NodeStatus(sets=(), conditions=conditions_for((), 0, None)), is_final=True)
    reporting = Reporting(reporter, node)
    yield reporting
    if reporting.task is not None:
        reporting.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporting.task
    await api.close()
    cluster.kubectl_ok("delete", "node", name)


async def wait_owner(cluster: KubeCluster, node: dict[str, Any], *, what: str) -> list[Any]:
    name = node["metadata"]["name"]

    async def owners() -> list[Any] | None:
        nis = await asyncio.to_thread(get, cluster, "nodeimagestatuses", name)
        found = (nis or {}).get("metadata", {}).get("ownerReferences")
        return list(found) if found else None

    return await wait_for_async(owners, timeout_s=20, what=what)


def expected_owner(node: dict[str, Any]) -> list[dict[str, str]]:
    meta = node["metadata"]
    return [{"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta["uid"]}]


async def test_node_learnt_after_the_first_write_is_applied_without_a_status_change(
    cluster: KubeCluster, reporting: Reporting
) -> None:
    name = reporting.node["metadata"]["name"]
    reporting.start()

    async def written() -> dict[str, Any] | None:
        return await asyncio.to_thread(get, cluster, "nodeimagestatuses", name)

    first = await wait_for_async(written, timeout_s=20, what="the first status write")
    assert "ownerReferences" not in first["metadata"]

    reporting.reporter.set_node(reporting.node)  # nothing else changes: a quiet node
    owners = await wait_owner(cluster, reporting.node, what="the owner reference")
    assert owners == expected_owner(reporting.node)


def _has_connection_to(port: int) -> bool:
    """Whether this process holds an established TCP connection to 127.0.0.1:``port``."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = str(fd.readlink())
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    with Path("/proc/self/net/tcp").open() as table:
        next(table)
        for line in table:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state == "01" and remote.endswith(f":{port:04X}") and inode in inodes:
                return True
    return False


async def test_node_learnt_while_the_first_write_is_on_its_way_is_not_lost(
    cluster: KubeCluster, reporting: Reporting
) -> None:
    """The Node's uid arrives while the owner-less apply is in flight (the API server is
    frozen with SIGSTOP while it waits for the answer); the owner must still be applied."""
    pid = cluster.apiserver_pid
    os.kill(pid, signal.SIGSTOP)
    try:
        reporting.start()
        await wait_for_async(
            lambda: asyncio.to_thread(_has_connection_to, cluster.port),
            timeout_s=20, what="the first apply to be on its way",
        )  # fmt: skip
        assert reporting.reporter.writes == 0
        reporting.reporter.set_node(reporting.node)
    finally:
        os.kill(pid, signal.SIGCONT)
    owners = await wait_owner(cluster, reporting.node, what="the owner reference")
    assert owners == expected_owner(reporting.node)
