"""The node's name from the kubelet's certificate, and its pools as MCO decides, against a real
kube-apiserver (deploy/ RBAC and admission policy) and a real CRI-O.

The Node is named with an FQDN, as on cloud and many bare-metal installs; nodeagent is not told
its name: it reads the CN ``system:node:<fqdn>`` of a kubelet-like client certificate.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Pushed
from tests.integration.pins.test_flow import pinned_flags
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import (
    apply,
    get,
    install_deploy,
    install_mco,
    pinned_image_set,
    pool,
    remove_mco,
    set_entry,
)
from tests.testenv.pki import Authority
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.integration

FQDN = "master-0.ocp4.example.com"
MASTER = {"node-role.kubernetes.io/master": ""}
WORKER = {"node-role.kubernetes.io/worker": ""}
INFRA = {"node-role.kubernetes.io/infra": ""}
EDGE = {"node-role.kubernetes.io/edge": ""}


@pytest.fixture
def mco(kube: KubeCluster) -> Iterator[KubeCluster]:
    install_deploy(kube)
    install_mco(kube)
    yield kube
    remove_mco(kube)


def agent_config(kube: KubeCluster, base: Path) -> str:
    """[cluster] without node_name: the name comes from the kubelet certificate in ``base``."""
    cert = base / "kubelet-client-current.pem"
    Authority("kubelet-signer").client(FQDN).write_pair(cert, cert)
    return f"""
[cluster]
enabled = true
kubeconfig = "{kube.kubeconfig_for_node(FQDN)}"
kubelet_client_cert = "{cert}"
kubelet_env_files = ["{base / "no-kubelet-env"}"]
status_interval_s = 0.5
heartbeat_s = 2.0
request_timeout_s = 10.0
"""


def wait_placement(kube: KubeCluster, agent: Agent, check: Any, what: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        if agent.process is not None and agent.process.poll() is not None:
            raise AssertionError(f"nodeagent exited\n{agent.log_text()[-4000:]}")
        nis = get(kube, "nodeimagestatuses", FQDN)
        placement = (nis or {}).get("status", {}).get("placement")
        return nis if nis is not None and placement is not None and check(nis) else None

    return wait_for(
        probe,
        timeout_s=90,
        what=what,
        detail=lambda: f"{get(kube, 'nodeimagestatuses', FQDN)}\n{agent.log_text()[-4000:]}",
    )


def is_pinned(name: str) -> Any:
    def check(nis: dict[str, Any]) -> bool:
        entry = set_entry(nis, name)
        return entry is not None and entry.get("currentGeneration") == 1

    return check


async def test_fqdn_master_takes_the_master_pool_only_and_two_custom_pools_are_refused(
    mco: KubeCluster, fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    kube = mco
    kube.create_node(FQDN, {**MASTER, **WORKER})  # a compact/SNO master carries the worker label
    a, b = pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)
    apply(kube, pinned_image_set("cp-set", [a]))
    apply(kube, pinned_image_set("worker-set", [b]))
    apply(kube, pool("master", MASTER, ["cp-set"]))
    apply(kube, pool("worker", WORKER, ["worker-set"]))
    apply(kube, pool("infra", INFRA, []))
    apply(kube, pool("edge", EDGE, []))
    everything = pool("everything", {}, ["worker-set"])
    everything["spec"]["nodeSelector"] = {}  # an empty selector matches no node
    apply(kube, everything)
    base = tmp_path / "agent"
    base.mkdir()
    agent = Agent(base, fresh_crio, extra_config=agent_config(kube, base))
    try:
        with agent:
            # The status write under the FQDN passes the admission policy (name from the cert).
            nis = wait_placement(kube, agent, is_pinned("cp-set"), "cp-set pinned")
            assert nis["status"]["nodeName"] == FQDN
            assert nis["status"]["placement"] == {"mode": "pools", "pools": ["master"]}
            assert set_entry(nis, "worker-set") is None  # master beats worker; {} matches none
            assert await pinned_flags(fresh_crio, [a, b]) == {a: True, b: None}
            log = agent.log_text()
            assert "node_name_chosen" in log
            assert "the kubelet's client certificate" in log

            # Two custom pools: refused with a reason; the last known sets stay pinned.
            kube.kubectl_ok("label", "node", FQDN, "node-role.kubernetes.io/infra=",
                            "node-role.kubernetes.io/edge=")  # fmt: skip
            nis = wait_placement(
                kube,
                agent,
                lambda n: n["status"]["placement"].get("reason") == "PoolMembershipInvalid",
                "pool membership refused",
            )
            assert (
                "matches 2 custom MachineConfigPools (edge, infra)"
                in (nis["status"]["placement"]["message"])
            )
            assert set_entry(nis, "cp-set") is not None
            assert await pinned_flags(fresh_crio, [a]) == {a: True}
            assert "pool_membership_invalid" in agent.log_text()

            # Back to one custom pool on a master: master wins (plus worker), infra is ignored.
            kube.kubectl_ok("label", "node", FQDN, "node-role.kubernetes.io/edge-")
            nis = wait_placement(
                kube, agent, is_pinned("worker-set"), "master + worker pools after the relabel"
            )
            placement = nis["status"]["placement"]
            assert placement["pools"] == ["master", "worker"]
            assert "reason" not in placement
            assert "custom pool infra also matches this master node" in placement["message"]
            assert await pinned_flags(fresh_crio, [a, b]) == {a: True, b: True}
    finally:
        kube.kubectl("delete", "--ignore-not-found", "pinnedimageset", "cp-set", "worker-set")
        kube.kubectl("delete", "--ignore-not-found", "node", FQDN)
