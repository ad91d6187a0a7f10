"""``nodeagent site wait`` against a real kube-apiserver: the gate before a cluster upgrade.

Node objects are created as admin; each node's NodeImageStatus is written as its daemon
writes it (the object, then server-side apply of ``/status`` with the node's own
identity, bodies from ``cluster.objects.status_object``). ``site wait`` runs as a
subprocess with an admin kubeconfig, scoped by a label unique to the test, since the
session's API server holds other tests' Nodes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from nodeagent.adapters.kube import SERVICE_ACCOUNT_DIR, KubeApi
from nodeagent.cluster.holdings import HeldBundle, HeldTarget, holdings_object, holdings_of
from nodeagent.cluster.kinds import NODE_IMAGE_HOLDINGS, NODE_IMAGE_STATUS
from nodeagent.cluster.objects import (
    FIELD_MANAGER,
    NodeIdentity,
    owner_object,
    status_object,
)
from nodeagent.errors import ApiAccessDenied, ApiUnreachable, ConfigInvalid, TransientError
from nodeagent.status import (
    BundleReport,
    ImageFailure,
    NodeStatus,
    PullProgress,
    SetState,
    SetStatus,
)
from tests.testenv.kube import KubeCluster, _free_ports
from tests.testenv.kubeobjects import install_deploy
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.integration

BUNDLE = "edge-4.18.3"


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> KubeCluster:
    install_deploy(kube)
    return kube


@pytest.fixture
def site(cluster: KubeCluster) -> Iterator[tuple[str, list[str]]]:
    """Three new Nodes with a label of their own: (the selector, their names)."""
    run = uuid.uuid4().hex[:8]
    names = [f"site-{run}-{i}" for i in range(3)]
    for name in names:
        cluster.create_node(name, {"sitewait": run})
    yield f"sitewait={run}", names
    cluster.kubectl("delete", "node", *names, "--wait=false")


def write_status(
    kube: KubeCluster, node: str, report: BundleReport, sets: tuple[SetStatus, ...] = ()
) -> None:
    """The node's NodeImageStatus, written as its daemon writes it (own identity, /status)."""
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    identity = NodeIdentity(node, "")
    body = status_object(
        identity,
        NodeStatus(sets=sets, conditions=(), bundles=(report,)),
        PullProgress(),
        placement=None,
        previous_conditions=[],
        now=now,
        agent_version="test",
    )

    async def write() -> None:
        api = KubeApi(kube.kubeconfig_for_node(node), timeout_s=10, field_manager=FIELD_MANAGER)
        try:
            await api.apply(NODE_IMAGE_STATUS, owner_object(identity))
            await api.apply(NODE_IMAGE_STATUS, body, subresource="status")
        finally:
            await api.close()

    asyncio.run(write())


def pinned(bundle_id: str = BUNDLE) -> BundleReport:
    return BundleReport("/run/media/usb", "pinned", bundle_id, images_total=3, images_present=3)


def importing(done: int, total: int) -> BundleReport:
    progress = {"doneBytes": done, "totalBytes": total}
    return BundleReport("/run/media/usb", "importing", BUNDLE, images_total=3, progress=progress)


def site_cmd(
    kube: KubeCluster, tmp_path: Path, *args: str, kubeconfig: Path | None = None
) -> list[str]:
    return [
        sys.executable, "-m", "nodeagent", "--root", str(tmp_path), "site", *args,
        "--kubeconfig", str(kubeconfig or kube.admin_kubeconfig),
    ]  # fmt: skip


def test_wait_names_a_node_without_status_then_opens_when_it_pins(
    cluster: KubeCluster, site: tuple[str, list[str]], tmp_path: Path
) -> None:
    selector, (first, second, silent) = site
    write_status(cluster, first, pinned())
    write_status(cluster, second, pinned())
    wait = ("wait", "--bundle", BUNDLE, "--selector", selector, "--interval", "0.2")

    timed_out = subprocess.run(
        site_cmd(cluster, tmp_path, *wait, "--timeout", "2"),
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert timed_out.returncode == TransientError.exit_code, timed_out.stderr
    assert f"{silent}: no status" in timed_out.stderr
    assert "2/3 nodes pinned" in timed_out.stderr
    assert first not in timed_out.stderr.split("error:", 1)[1]

    log = tmp_path / "wait.stderr"
    with log.open("w") as err:
        proc = subprocess.Popen(
            site_cmd(cluster, tmp_path, *wait, "--timeout", "45"),
            stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
    try:
        wait_for(
            lambda: f"{silent}: no status" in log.read_text(),
            timeout_s=20, what="the wait names the node without status", detail=log.read_text,
        )  # fmt: skip
        write_status(cluster, silent, importing(250, 1000))
        wait_for(
            lambda: f"{silent}: importing, 750 B left" in log.read_text(),
            timeout_s=20, what="the wait sees the import in progress", detail=log.read_text,
        )  # fmt: skip
        assert proc.poll() is None, "the wait ended before every node pinned"
        started = time.monotonic()
        write_status(cluster, silent, pinned())
        out, _ = proc.communicate(timeout=20)
        latency_s = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()
    assert out.strip() == f"bundle {BUNDLE}: 3/3 nodes pinned, 3 holding, 0 failing"
    print(f"site wait returned {latency_s:.2f} s after the last node pinned (interval 0.2 s)")
    assert latency_s < 5


def upgrade_set(state: SetState, current: int | None, desired: int, **extra: Any) -> SetStatus:
    return SetStatus(
        "upgrade", "bundle", True, state, desired, current, None, None, 3, 3, 2, **extra
    )


def test_wait_for_a_set_needs_its_current_generation(
    cluster: KubeCluster, site: tuple[str, list[str]], tmp_path: Path
) -> None:
    selector, (first, second, third) = site
    write_status(cluster, first, pinned(), (upgrade_set("Pinned", 2, 2),))
    write_status(cluster, second, pinned(), (upgrade_set("Progressing", 1, 2),))
    failed = upgrade_set(
        "Degraded", 1, 2, reason="ImageNotFound",
        failures=(ImageFailure(f"r.example/x@sha256:{'1' * 64}", "ImageNotFound", "gone"),),
    )  # fmt: skip
    write_status(cluster, third, pinned(), (failed,))
    wait = ("wait", "--bundle", BUNDLE, "--set", "upgrade", "--selector", selector)
    result = subprocess.run(
        site_cmd(cluster, tmp_path, *wait, "--interval", "0.2", "--timeout", "1"),
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 75, result.stderr
    assert f"bundle {BUNDLE} set upgrade: 1/3 nodes pinned" in result.stderr
    assert f"  {second}: set Progressing (generation 1/2, 2 of 3 images pinned)" in result.stderr
    assert f"  {third}: failing: ImageNotFound: gone" in result.stderr


def test_status_lists_each_bundle_and_the_silent_node_with_the_reader_role(
    cluster: KubeCluster, site: tuple[str, list[str]], tmp_path: Path
) -> None:
    selector, (first, second, silent) = site
    write_status(cluster, first, pinned())
    write_status(cluster, second, importing(0, 4096))
    reader = f"site-reader-{selector.rsplit('=', 1)[1]}"
    cluster.kubectl_ok(
        "create", "clusterrolebinding", reader, "--clusterrole=nodeagent:site-reader",
        f"--user={reader}",
    )  # fmt: skip
    try:
        result = subprocess.run(
            site_cmd(
                cluster, tmp_path, "status", "--selector", selector,
                kubeconfig=cluster.kubeconfig_for(reader),
            ),
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    finally:
        cluster.kubectl("delete", "clusterrolebinding", reader)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "3 nodes in scope, 2 reporting",
        f"scope: Nodes matching '{selector}' (--selector)",
        f"no status: {silent}",
        f"bundle {BUNDLE}: 1/3 nodes pinned, 2 holding, 0 failing, 4 KiB left",
        f"  {second}: importing, 4 KiB left",
        f"  {silent}: no status (nodeagent never reported: not started, or cannot reach the API)",
    ]


def test_an_unreachable_api_server_exits_69(cluster: KubeCluster, tmp_path: Path) -> None:
    (port,) = _free_ports(1)
    text = cluster.admin_kubeconfig.read_text().replace(
        cluster.server_url, f"https://127.0.0.1:{port}"
    )
    kubeconfig = tmp_path / "gone.kubeconfig"
    kubeconfig.write_text(text)
    result = subprocess.run(
        site_cmd(cluster, tmp_path, "wait", "--bundle", BUNDLE, kubeconfig=kubeconfig),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == ApiUnreachable.exit_code, result.stderr
    assert "error: ApiUnreachable" in result.stderr


def test_credentials_without_the_reader_role_exit_77(
    cluster: KubeCluster, site: tuple[str, list[str]], tmp_path: Path
) -> None:
    selector, (first, _, _) = site
    result = subprocess.run(
        site_cmd(
            cluster, tmp_path, "status", "--selector", selector,
            kubeconfig=cluster.kubeconfig_for_node(first),
        ),
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == ApiAccessDenied.exit_code, result.stderr
    assert "error: ApiAccessDenied" in result.stderr


def test_in_cluster_with_a_service_account_bound_to_the_reader_role(
    cluster: KubeCluster, site: tuple[str, list[str]], tmp_path: Path
) -> None:
    """A Job's view: the pod's token, CA and namespace files and the service environment."""
    selector, names = site
    for name in names:
        write_status(cluster, name, pinned())
    account = f"site-gate-{selector.rsplit('=', 1)[1]}"
    cluster.kubectl_ok("create", "serviceaccount", account, "-n", "default")
    try:
        cluster.kubectl_ok(
            "create", "clusterrolebinding", account, "--clusterrole=nodeagent:site-reader",
            f"--serviceaccount=default:{account}",
        )  # fmt: skip
        token = cluster.kubectl_ok("create", "token", account, "-n", "default").strip()
        mounted = tmp_path / SERVICE_ACCOUNT_DIR.relative_to("/")
        mounted.mkdir(parents=True)
        (mounted / "token").write_text(token)
        (mounted / "namespace").write_text("default")
        (mounted / "ca.crt").write_bytes(cluster.ca_file.read_bytes())
        url = urlsplit(cluster.server_url)
        env = os.environ | {
            "KUBERNETES_SERVICE_HOST": str(url.hostname),
            "KUBERNETES_SERVICE_PORT": str(url.port),
        }
        cmd = [
            sys.executable, "-m", "nodeagent", "--root", str(tmp_path), "site", "wait",
            "--in-cluster", "--bundle", BUNDLE, "--selector", selector, "--timeout", "20",
        ]  # fmt: skip
        result = subprocess.run(
            cmd, capture_output=True, text=True, timeout=60, check=False, env=env
        )
    finally:
        cluster.kubectl("delete", "clusterrolebinding", account)
        cluster.kubectl("delete", "serviceaccount", account, "-n", "default")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"bundle {BUNDLE}: 3/3 nodes pinned, 3 holding, 0 failing"


# ---------------------------------------------------------------- the default scope: the target


def publish_target(kube: KubeCluster, node: str, bundle_id: str, target: HeldTarget) -> None:
    """The node's NodeImageHoldings listing the bundle with ``target``, written as the node."""
    held = HeldBundle(bundle_id, "sha256:" + "a" * 64, True, 3, 300, target)
    holdings = holdings_of(node, [held], is_serving=True, address="10.9.9.9:9447")

    async def write() -> None:
        api = KubeApi(kube.kubeconfig_for_node(node), timeout_s=10, field_manager=FIELD_MANAGER)
        try:
            await api.apply(NODE_IMAGE_HOLDINGS, holdings_object(NodeIdentity(node, ""), holdings))
        finally:
            await api.close()

    asyncio.run(write())


@pytest.fixture
def target_site(cluster: KubeCluster) -> Iterator[tuple[str, dict[str, str]]]:
    """Four new Nodes: two amd64 edge Nodes, an arm64 edge Node and an amd64 worker; the
    edge label is unique to the test. Returns (the edge selector, role → Node name)."""
    run = uuid.uuid4().hex[:8]
    names = {role: f"scope-{run}-{role}" for role in ("edge0", "edge1", "edgearm", "worker")}
    for role, name in names.items():
        labels = {"sitescope": run, "kubernetes.io/arch": "arm64" if role == "edgearm" else "amd64"}
        if role != "worker":
            labels["sitescope-edge"] = run
        cluster.create_node(name, labels)
    yield f"sitescope-edge={run}", names
    cluster.kubectl("delete", "nih", *names.values(), "--ignore-not-found", "--wait=false")
    cluster.kubectl("delete", "node", *names.values(), "--wait=false")


def test_wait_without_a_selector_takes_the_bundles_published_target(
    cluster: KubeCluster, target_site: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    selector, names = target_site
    bundle_id = f"edge-{selector.rsplit('=', 1)[1]}"
    wait = ("wait", "--bundle", bundle_id, "--interval", "0.2")

    # Nobody holds it yet: every Node of the (shared) API server, and the output says why.
    unknown = subprocess.run(
        site_cmd(cluster, tmp_path, *wait, "--timeout", "1"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert unknown.returncode == TransientError.exit_code, unknown.stderr
    assert (
        "scope: every Node; the bundle's target is not known until a node holds it"
        in unknown.stderr
    )
    assert f"  {names['worker']}: no status" in unknown.stderr

    # One edge node holds and pins it: the scope is the amd64 edge Nodes, the other one lags.
    target = HeldTarget("amd64", selector)
    publish_target(cluster, names["edge0"], bundle_id, target)
    write_status(cluster, names["edge0"], pinned(bundle_id))
    lagging = subprocess.run(
        site_cmd(cluster, tmp_path, *wait, "--timeout", "1"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert lagging.returncode == TransientError.exit_code, lagging.stderr
    assert (
        f"scope: the bundle's target, amd64 Nodes matching '{selector}' "
        "(published by 1 node that holds it)"
    ) in lagging.stderr
    assert f"bundle {bundle_id}: 1/2 nodes pinned" in lagging.stderr
    assert f"  {names['edge1']}: no status" in lagging.stderr
    for outside in (names["edgearm"], names["worker"]):
        assert outside not in lagging.stderr, lagging.stderr

    # The other amd64 edge node pins it (an older agent: status only, no holdings): open.
    write_status(cluster, names["edge1"], pinned(bundle_id))
    opened = subprocess.run(
        site_cmd(cluster, tmp_path, *wait, "--timeout", "20"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.strip() == f"bundle {bundle_id}: 2/2 nodes pinned, 2 holding, 0 failing"
    assert opened.stderr.strip() == (
        f"scope: the bundle's target, amd64 Nodes matching '{selector}' "
        "(published by 1 node that holds it)"
    )

    # A node publishing another target for the id: no default is guessed (78), --selector is.
    publish_target(cluster, names["worker"], bundle_id, HeldTarget("amd64", ""))
    refused = subprocess.run(
        site_cmd(cluster, tmp_path, *wait, "--timeout", "20"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == ConfigInvalid.exit_code, refused.stderr
    assert "2 different targets" in refused.stderr
    assert "pass --selector" in refused.stderr
    chosen = subprocess.run(
        site_cmd(cluster, tmp_path, *wait, "--selector", selector, "--timeout", "1"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert chosen.returncode == TransientError.exit_code, chosen.stderr
    assert f"  {names['edgearm']}: no status" in chosen.stderr
