"""Cluster mode against the real kube-apiserver: this node's pods read with the node's own
identity (field selector ``spec.nodeName``), one warning Event per ``Always`` pod (once per
uid, however many runs), and ``OfflineReady`` in the node's NodeImageStatus."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.kube import KubeApi
from nodeagent.adapters.offline import HostFacts, KubePodWarnings, api_pods
from nodeagent.cluster.reporter import StatusReporter
from nodeagent.cluster.tasks import Connection
from nodeagent.config import ClusterSettings, Config
from nodeagent.offline import findings as f
from nodeagent.offline.drill import EVENT_REASON, OfflineDrill
from nodeagent.offline.mirror_checks import POD_IMAGE_NOT_HELD
from nodeagent.reporting import Reporter
from nodeagent.status import NodeStatus, PullProgress, conditions_for
from tests.fakes.ports import RecordingLine
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import condition, get, install_deploy
from tests.testenv.waiting import wait_for_async

pytestmark = pytest.mark.integration

NODE = "offline-drill-node"
NAMESPACE = "offline-drill"
DIGEST_REF = "quay.example.com/app@sha256:" + "a" * 64


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> KubeCluster:
    install_deploy(kube)
    kube.create_node(NODE)
    kube.create_node(NODE + "-other")
    kube.kubectl_ok("create", "namespace", NAMESPACE)
    kube.kubectl_ok("-n", NAMESPACE, "create", "serviceaccount", "default")
    return kube


def create_pod(kube: KubeCluster, name: str, node: str, image: str, policy: str) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": image, "imagePullPolicy": policy}],
        },
    }
    out = kube.kubectl_ok("create", "-o", "json", "-f", "-", input=json.dumps(pod))
    created: dict[str, Any] = json.loads(out)
    return created


def events_about(kube: KubeCluster, uid: str) -> list[dict[str, Any]]:
    out = kube.kubectl_ok("-n", NAMESPACE, "get", "events", "-o", "json")
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return [e for e in items if e["involvedObject"].get("uid") == uid]


@pytest.fixture
async def api(cluster: KubeCluster) -> AsyncIterator[KubeApi]:
    client = KubeApi(cluster.kubeconfig_for_node(NODE), timeout_s=10, field_manager="nodeagent")
    yield client
    await client.close()


async def test_pods_events_and_the_condition(
    cluster: KubeCluster, api: KubeApi, cri: CriClient, tmp_path: Path
) -> None:
    always = create_pod(cluster, "pulls-always", NODE, "quay.example.com/web:1", "Always")
    create_pod(cluster, "by-digest", NODE, DIGEST_REF, "IfNotPresent")
    elsewhere = create_pod(cluster, "elsewhere", NODE + "-other", "q.example.com/x", "Always")

    settings = ClusterSettings(
        enabled=True,
        kubeconfig=cluster.kubeconfig_for_node(NODE),
        node_name=NODE,
        status_interval_s=0.2,
        events=False,
        request_timeout_s=10,
    )
    config = dataclasses.replace(Config.default(root=tmp_path), cluster=settings)
    status = StatusReporter(config, api, Connection(api.server), progress=PullProgress)
    reporter = Reporter(
        line=RecordingLine(), store=JsonStateStore(tmp_path / "state"), cluster=status
    )
    reporter.sync_finished(NodeStatus(sets=(), conditions=conditions_for((), 0, None)))
    drill = OfflineDrill(
        HostFacts(config, cri, pods=api_pods(api, NODE)),
        reporter,
        interval_s=600,
        warnings=KubePodWarnings(api, NODE),
    )
    report = await drill.run_once()
    await drill.run_once()  # a second run: no second Event

    pods = {(x.reason, x.pod.name if x.pod else "") for x in report.findings}
    assert (f.POD_PULLS_ALWAYS, "pulls-always") in pods
    assert (f.POD_IMAGE_BY_TAG, "pulls-always") in pods
    assert not any(name == "elsewhere" for _, name in pods)
    # by digest, IfNotPresent: only that nothing on the node holds it (not pinned, not stored)
    assert {reason for reason, name in pods if name == "by-digest"} == {POD_IMAGE_NOT_HELD}

    events = events_about(cluster, always["metadata"]["uid"])
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", EVENT_REASON)]
    assert events[0]["involvedObject"]["kind"] == "Pod"
    assert events_about(cluster, elsewhere["metadata"]["uid"]) == []

    task = asyncio.create_task(status.run())
    try:

        async def published() -> dict[str, Any] | None:
            nis = get(cluster, "nodeimagestatuses.nodeagent.io", NODE)
            found = condition(nis, "OfflineReady")
            return found if found and found["status"] == "False" else None

        offline = await wait_for_async(published, timeout_s=30, what="OfflineReady published")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert offline["reason"] == report.findings[0].reason
    saved = JsonStateStore(tmp_path / "state").load("status")
    assert saved is not None
    assert any(c["type"] == "OfflineReady" for c in saved["conditions"])
