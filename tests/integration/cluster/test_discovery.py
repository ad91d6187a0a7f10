"""Discovery against a real kube-apiserver (decision 0029): NodeImageHoldings, written only
when the holdings change, each node only its own, watched by the peers.

The publisher and the watcher run in process with a kubelet's identity (a client
certificate for ``system:node:<name>``), over a real store in the test's directory
(``tests/testenv/store_bundles.py``); the CRD, RBAC and admission policy are deploy/'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.kube import KubeApi
from nodeagent.adapters.store.holdings import StoreHoldings
from nodeagent.cluster.holdings import (
    MAX_TARGET_SELECTOR_CHARS,
    HeldBundle,
    HeldTarget,
    holdings_object,
    holdings_of,
    parse_holdings,
)
from nodeagent.cluster.kinds import NODE_IMAGE_HOLDINGS
from nodeagent.cluster.objects import FIELD_MANAGER, NodeIdentity
from nodeagent.cluster.reporter import StatusReporter
from nodeagent.cluster.tasks import Connection
from nodeagent.config import ClusterSettings, Config
from nodeagent.errors import ApiAccessDenied, ApiRequestRejected
from nodeagent.site.publishing import BundleStepsTrigger, HoldingsPublisher, PeerWatcher
from nodeagent.status import BundleReport, NodeStatus, PullProgress
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import get, install_deploy
from tests.testenv.store_bundles import store_blobs, store_bundle
from tests.testenv.waiting import wait_for_async

pytestmark = pytest.mark.integration

BLOBS = [b"top manifest", b"layer one" * 1000, b"layer two" * 500]
NEW_BLOBS = [b"new top manifest", b"new layer" * 700]
DIGEST_A, DIGEST_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> KubeCluster:
    install_deploy(kube)
    return kube


@pytest.fixture
def nodes(cluster: KubeCluster) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Three new Nodes with an InternalIP each and a label of their own."""
    run = uuid.uuid4().hex[:8]
    made = []
    for i in range(3):
        name = f"disc-{run}-{i}"
        cluster.create_node(name, {"discovery": run})
        status = {"status": {"addresses": [{"type": "InternalIP", "address": f"10.9.0.{i + 1}"}]}}
        cluster.kubectl_ok(
            "patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status)
        )
        node = get(cluster, "node", name)
        assert node is not None
        made.append(node)
    yield f"discovery={run}", made
    names = [n["metadata"]["name"] for n in made]
    # The test environment runs no garbage collector: the owned objects go by hand.
    cluster.kubectl("delete", "nih", *names, "--ignore-not-found", "--wait=false")
    cluster.kubectl("delete", "node", *names, "--wait=false")


def name_of(node: dict[str, Any]) -> str:
    return str(node["metadata"]["name"])


def node_api(cluster: KubeCluster, name: str) -> KubeApi:
    return KubeApi(cluster.kubeconfig_for_node(name), timeout_s=10, field_manager=FIELD_MANAGER)


def holdings_body(name: str, uid: str, *bundles: HeldBundle) -> dict[str, Any]:
    holdings = holdings_of(name, bundles, is_serving=True, address="10.9.9.9:9447")
    return holdings_object(NodeIdentity(name, uid), holdings)


async def nih(cluster: KubeCluster, name: str) -> dict[str, Any] | None:
    return await asyncio.to_thread(get, cluster, "nodeimageholdings", name)


async def version_of(cluster: KubeCluster, resource: str, name: str) -> str:
    found = await asyncio.to_thread(get, cluster, resource, name)
    assert found is not None, f"{resource} {name} is not there"
    return str(found["metadata"]["resourceVersion"])


# ---------------------------------------------------------------- the CRD and who may write


def test_the_api_server_refuses_an_object_over_its_bounds(
    cluster: KubeCluster, nodes: tuple[str, list[dict[str, Any]]]
) -> None:
    name = name_of(nodes[1][0])
    entry: dict[str, Any] = {
        "bundleId": "a", "manifestDigest": DIGEST_A, "complete": True, "blobs": 1, "bytes": 1
    }  # fmt: skip
    longest = "zone in (" + ",".join(["v" * 60] * 100) + ")"
    longest = longest[: MAX_TARGET_SELECTOR_CHARS - 1].rsplit(",", 1)[0] + ")"
    longest += " " * (MAX_TARGET_SELECTOR_CHARS - len(longest))
    long = longest + " "
    bad_specs: dict[str, dict[str, Any]] = {
        "too many bundles": {
            "bundleCount": 101,
            "bundles": [entry | {"bundleId": f"b{i}"} for i in range(101)],
        },
        "a digest of another form": {"bundles": [entry | {"manifestDigest": "md5:00"}]},
        "an address too long": {"address": "x" * 301},
        "a count below the list": {"bundleCount": 0, "bundles": [entry]},
        "a target selector over 4096 characters": {
            "bundles": [entry | {"target": {"architecture": "amd64", "nodeSelector": long}}]
        },
        "a target architecture of another form": {
            "bundles": [entry | {"target": {"architecture": "AMD64", "nodeSelector": ""}}]
        },
        "a target without its architecture": {
            "bundles": [entry | {"target": {"nodeSelector": "zone=a"}}]
        },
    }
    for what, change in bad_specs.items():
        spec = {"nodeName": name, "serving": True, "bundleCount": 1, "bundles": []} | change
        body = {
            "apiVersion": "nodeagent.io/v1alpha1",
            "kind": "NodeImageHoldings",
            "metadata": {"name": name},
            "spec": spec,
        }
        result = cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(body))
        assert result.returncode != 0, f"{what} was accepted"
        assert "Invalid" in result.stderr or "invalid" in result.stderr, (what, result.stderr)
    assert cluster.kubectl("get", "nih", name).returncode != 0  # nothing was stored
    # At the bound, the same target is taken, and it reads back as nodeagent reads a peer's.
    assert len(longest) == MAX_TARGET_SELECTOR_CHARS
    held = HeldBundle("a", DIGEST_A, True, 1, 1, HeldTarget("amd64", longest))
    body = holdings_body(name, "", held)
    result = cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(body))
    assert result.returncode == 0, result.stderr
    stored = get(cluster, "nih", name)
    assert stored is not None
    assert parse_holdings(stored).bundles == (held,)
    cluster.kubectl_ok("delete", "nih", name)


async def test_a_node_writes_its_own_holdings_and_not_another_nodes(
    cluster: KubeCluster, nodes: tuple[str, list[dict[str, Any]]]
) -> None:
    (own, other, _) = (name_of(n) for n in nodes[1])
    api = node_api(cluster, own)
    held = HeldBundle("site-1", DIGEST_A, True, 3, 300)
    try:
        written = await api.apply(NODE_IMAGE_HOLDINGS, holdings_body(own, "", held))
        assert written["spec"]["bundles"][0]["manifestDigest"] == DIGEST_A
        with pytest.raises(ApiAccessDenied, match="may only write the object named after"):
            await api.apply(NODE_IMAGE_HOLDINGS, holdings_body(other, "", held))
        lying = holdings_body(own, "", held)
        lying["spec"]["nodeName"] = other
        with pytest.raises((ApiAccessDenied, ApiRequestRejected), match="nodeName"):
            await api.apply(NODE_IMAGE_HOLDINGS, lying)
    finally:
        await api.close()
    assert await nih(cluster, other) is None


# ---------------------------------------------------------------- the publisher


@dataclasses.dataclass
class Publishing:
    node: dict[str, Any]
    store: Path
    api: KubeApi
    publisher: HoldingsPublisher
    status: StatusReporter
    tasks: list[asyncio.Task[None]]

    @property
    def name(self) -> str:
        return name_of(self.node)


def _publisher(api: KubeApi, store: Path, name: str) -> HoldingsPublisher:
    return HoldingsPublisher(
        api, Connection(api.server), StoreHoldings(store), node=name, is_serving=True,
        listen="0.0.0.0:9447", advertise="", rescan_s=3600, recheck_s=1,
    )  # fmt: skip


@pytest.fixture
async def publishing(
    cluster: KubeCluster, nodes: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> AsyncIterator[Publishing]:
    """The first Node's publisher over a store holding one complete bundle, and its status
    reporter writing progress every 0.2 s, both running."""
    node = nodes[1][0]
    name = name_of(node)
    store = tmp_path / "store"
    store_bundle(
        store, "site-1", BLOBS, node_selector="zone in (b, a),node-role.kubernetes.io/edge"
    )
    settings = ClusterSettings(
        enabled=True, kubeconfig=cluster.kubeconfig_for_node(name), node_name=name,
        status_interval_s=0.1, progress_interval_s=0.2, heartbeat_s=0.5, events=False,
        request_timeout_s=10,
    )  # fmt: skip
    config = dataclasses.replace(Config.default(root=tmp_path), cluster=settings)
    api = node_api(cluster, name)
    publisher = _publisher(api, store, name)
    status = StatusReporter(config, api, Connection(api.server), progress=PullProgress)
    publisher.set_node(node)
    status.set_node(node)
    tasks = [asyncio.create_task(publisher.run()), asyncio.create_task(status.run())]
    yield Publishing(node, store, api, publisher, status, tasks)
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await api.close()


def storing(bundle_id: str, state: str, done: int) -> NodeStatus:
    report = BundleReport(
        "/run/media/usb", state, bundle_id,  # type: ignore[arg-type]
        progress={"doneBytes": done, "totalBytes": 10_000},
    )  # fmt: skip
    return NodeStatus(sets=(), conditions=(), bundles=(report,))


async def until(test: Callable[[], bool], what: str) -> None:
    async def check() -> bool:
        return test()

    await wait_for_async(check, timeout_s=30, what=what)


async def above(count: Callable[[], int], start: int, what: str) -> None:
    await until(lambda: count() > start, what)


async def wait_spec(cluster: KubeCluster, name: str, what: str, test: Any) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        obj = await nih(cluster, name)
        return obj if obj is not None and test(obj["spec"]) else None

    return await wait_for_async(found, timeout_s=30, what=what)


async def test_holdings_are_written_once_per_change_never_with_progress(
    cluster: KubeCluster, publishing: Publishing
) -> None:
    p, name = publishing, publishing.name
    first = await wait_spec(cluster, name, "the first holdings", lambda s: s["bundles"])
    assert first["spec"]["address"] == "10.9.0.1:9447"
    assert first["spec"]["bundles"][0] | {"manifestDigest": "-"} == {
        "bundleId": "site-1", "manifestDigest": "-", "complete": True,
        "blobs": 3, "bytes": sum(map(len, BLOBS)),
        # the stored manifest's target, in canonical form
        "target": {
            "architecture": "amd64", "nodeSelector": "node-role.kubernetes.io/edge,zone in (a,b)"
        },
    }  # fmt: skip
    assert first["metadata"]["ownerReferences"][0]["uid"] == p.node["metadata"]["uid"]
    assert p.publisher.writes == 1
    version = first["metadata"]["resourceVersion"]

    # The same holdings, looked at again and again: no write.
    for _ in range(5):
        scans = p.publisher.scans
        p.publisher.poke()
        await above(lambda: p.publisher.scans, scans, "a rescan")
    assert p.publisher.writes == 1
    assert await version_of(cluster, "nodeimageholdings", name) == version

    # The status object's progress writes, through the sink the Reporter writes to.
    trigger = BundleStepsTrigger(p.status, p.publisher)
    scans = p.publisher.scans
    trigger.update(storing("site-2", "storing", 0), is_final=False)  # a new step: one rescan
    await until(lambda: p.publisher.scans > scans and p.status.writes > 0, "the status write")
    scans, status_writes = p.publisher.scans, p.status.writes
    status_versions = {await version_of(cluster, "nodeimagestatuses", name)}
    for done in range(1000, 6000, 1000):
        writes = p.status.writes
        trigger.update(storing("site-2", "storing", done), is_final=False)
        await above(lambda: p.status.writes, writes, "a progress write of the status object")
        status_versions.add(await version_of(cluster, "nodeimagestatuses", name))
    assert p.status.writes >= status_writes + 5
    assert len(status_versions) >= 6
    assert p.publisher.scans == scans  # progress never made it look at the store
    assert await version_of(cluster, "nodeimageholdings", name) == version
    print(f"{p.status.writes - status_writes} status writes, 0 holdings writes")

    # A fetch starts (manifest, no record): one write, complete false.
    store_bundle(p.store, "site-2", NEW_BLOBS, is_recorded=False, stored=1)
    trigger.update(storing("site-2", "admitted", 0), is_final=False)
    started = await wait_spec(cluster, name, "site-2 started", lambda s: len(s["bundles"]) == 2)
    assert [b["complete"] for b in started["spec"]["bundles"]] == [True, False]
    # Its blobs arrive (the store changes, the steps do not): nothing written.
    store_blobs(p.store, NEW_BLOBS)
    trigger.update(storing("site-2", "storing", 9000), is_final=False)
    # It completes: one more write.
    store_bundle(p.store, "site-2", NEW_BLOBS)
    trigger.update(storing("site-2", "stored", 10_000), is_final=False)
    await wait_spec(
        cluster, name, "site-2 complete", lambda s: all(b["complete"] for b in s["bundles"])
    )
    assert p.publisher.writes == 3

    # A restarted agent with the same store writes nothing.
    again = _publisher(p.api, p.store, name)
    again.set_node(p.node)
    task = asyncio.create_task(again.run())
    try:
        await until(lambda: again.scans > 0, "the restarted publisher's scan")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert again.writes == 0


async def test_a_deleted_object_is_written_again(
    cluster: KubeCluster, publishing: Publishing
) -> None:
    name = publishing.name
    await wait_spec(cluster, name, "the first holdings", lambda s: s["bundles"])
    cluster.kubectl_ok("delete", "nih", name)
    await wait_spec(cluster, name, "the holdings again", lambda s: s["bundles"])
    assert publishing.publisher.writes == 2


# ---------------------------------------------------------------- the watcher


async def test_a_peer_sees_a_new_holding_and_never_itself(
    cluster: KubeCluster, nodes: tuple[str, list[dict[str, Any]]], publishing: Publishing
) -> None:
    watcher_name = name_of(nodes[1][2])
    api = node_api(cluster, watcher_name)
    watcher = PeerWatcher(
        api, Connection(api.server), node=watcher_name, static_peers=["10.9.0.1:9447"]
    )
    task = asyncio.create_task(watcher.run())
    try:
        version = await wait_for_async(
            lambda: asyncio.sleep(0, watcher.version or None),
            timeout_s=30, what="the watcher's first view",
        )  # fmt: skip
        mine = holdings_body(watcher_name, nodes[1][2]["metadata"]["uid"])
        await api.apply(NODE_IMAGE_HOLDINGS, mine)  # its own object: never a peer
        store_bundle(publishing.store, "site-3", NEW_BLOBS)
        started = time.monotonic()
        publishing.publisher.poke()
        version = await asyncio.wait_for(watcher.changed(version), 30)
        while not (peer := _peer(watcher, publishing.name)) or not peer.holds("site-3"):
            version = await asyncio.wait_for(watcher.changed(version), 30)
        print(f"a peer saw the new holding {time.monotonic() - started:.3f} s after the poke")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()
    assert peer.address == "10.9.0.1:9447"
    held = peer.holds("site-3")
    assert held is not None and held.is_complete
    assert watcher_name not in [p.node for p in watcher.peers()]
    # The static address is the discovered node's: not listed again as a static peer.
    assert [p for p in watcher.peers() if p.address == "10.9.0.1:9447" and not p.node] == []


def _peer(watcher: PeerWatcher, name: str) -> Any:
    return next((p for p in watcher.peers() if p.node == name), None)


# ---------------------------------------------------------------- site status


def test_site_status_names_the_node_holding_another_manifest(
    cluster: KubeCluster, nodes: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    selector, made = nodes
    names = [name_of(n) for n in made]
    digests = [DIGEST_A, DIGEST_A, DIGEST_B]

    async def publish() -> None:
        for name, digest, complete in zip(names, digests, (True, False, True), strict=True):
            api = node_api(cluster, name)
            try:
                held = HeldBundle("site-9", digest, complete, 3, 300)
                await api.apply(NODE_IMAGE_HOLDINGS, holdings_body(name, "", held))
            finally:
                await api.close()

    asyncio.run(publish())
    cmd = [
        sys.executable, "-m", "nodeagent", "--root", str(tmp_path), "site", "status",
        "--kubeconfig", str(cluster.admin_kubeconfig), "--selector", selector,
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"  held by: {names[0]}, {names[2]}" in lines, result.stdout
    assert f"  being fetched by: {names[1]}" in lines, result.stdout
    assert (
        f"  {names[2]}: holds manifest {DIGEST_B} under this id where most nodes hold "
        f"{DIGEST_A}: a different manifest under the same id"
    ) in lines, result.stdout
    waited = subprocess.run(
        [*cmd[:6], "wait", "--bundle", "site-9", *cmd[7:], "--timeout", "1", "--interval", "0.2"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert waited.returncode == 75, waited.stderr
    assert f"{names[2]}: holds manifest {DIGEST_B}" in waited.stderr
