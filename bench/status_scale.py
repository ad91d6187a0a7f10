"""Status-write scale: N simulated node agents against one real kube-apiserver, in one run.

Each simulated node runs nodeagent's real ``StatusReporter`` (the code the daemon runs),
with its own ``system:node:<name>`` client certificate, through the RBAC and admission
policy of deploy/. Only the pulls are simulated: each node works through a sync of
``--images`` images, ``--concurrency`` at a time, each pull taking a random 6-18 virtual
seconds, so a sync lasts about 10 virtual minutes. Time runs ``--speed`` times faster
than real time; the reporters' intervals are scaled the same way, so per-virtual-minute
figures are what a real cluster would see.

Two strategies, measured one after the other against the same API server:

* ``nodeagent``: the reporter as configured by default (a milestone at most 5 s after the
  last write, progress alone at most every 30 s, 60 s heartbeat while busy, nothing when
  nothing changed);
* ``per-event`` (the baseline): the same reporter with pacing off, i.e. a write after every
  pull start or finish, as a naive status writer does.

Printed: writes per node per virtual minute, conflicts (HTTP 409) and other failed writes,
kube-apiserver and etcd CPU seconds, and the ratios nodeagent / per-event. Run as root::

    .venv/bin/python -m bench.status_scale [--nodes 500] [--speed 4] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.adapters.kube import KubeApi
from nodeagent.cluster.api import Obj
from nodeagent.cluster.kinds import ResourceKind
from nodeagent.cluster.objects import FIELD_MANAGER
from nodeagent.cluster.reporter import StatusReporter
from nodeagent.cluster.tasks import Connection
from nodeagent.config import ClusterSettings, Config
from nodeagent.errors import NodeAgentError
from nodeagent.status import NodeStatus, PullProgress, SetStatus, conditions_for
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import install_deploy

VIRTUAL_MINUTES = 10.0
PULL_S = (6.0, 18.0)
REGISTRY = "registry.example.com"


class CountingApi(KubeApi):
    """The real adapter, counting write outcomes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conflicts = 0
        self.failures = 0

    async def apply(self, kind: ResourceKind, body: Obj, *, subresource: str | None = None) -> Obj:
        try:
            return await super().apply(kind, body, subresource=subresource)
        except NodeAgentError as exc:
            if "HTTP 409" in exc.message:
                self.conflicts += 1
            else:
                self.failures += 1
            raise


@dataclass
class SimNode:
    name: str
    api: CountingApi
    reporter: StatusReporter
    pulling: set[str] = dataclasses.field(default_factory=set)
    pulled: set[str] = dataclasses.field(default_factory=set)
    is_syncing: bool = True

    def progress(self) -> PullProgress:
        return PullProgress(tuple(sorted(self.pulling)), frozenset(self.pulled), 0, self.is_syncing)


def set_status(refs: list[str], pulled: set[str], state: Any) -> NodeStatus:
    done = len(pulled)
    item = SetStatus(
        name="release-4-20",
        source="cluster",
        is_persistent=True,
        state=state,
        desired_generation=1,
        current_generation=1 if state == "Pinned" else None,
        last_failed_generation=None,
        last_failed_error=None,
        images_total=len(refs),
        images_present=done if state == "Pinned" else 0,
        images_pinned=len(refs) if state == "Pinned" else 0,
        bytes_present=done * 180 << 20,
        bytes_to_pull=(len(refs) - done) * 90 << 20,
        pending=tuple(refs) if state != "Pinned" else (),
    )
    sets = (item,)
    return NodeStatus(sets=sets, conditions=conditions_for(sets, 0, None), runtime="cri-o 1.34.0")


async def simulate(node: SimNode, refs: list[str], concurrency: int, speed: float) -> None:
    rng = random.Random(node.name)
    node.reporter.update(set_status(refs, set(), "Progressing"), is_final=False)
    queue = list(refs)

    async def worker() -> None:
        while queue:
            ref = queue.pop()
            node.pulling.add(ref)
            node.reporter.poke()
            await asyncio.sleep(rng.uniform(*PULL_S) / speed)  # the simulated pull
            node.pulling.discard(ref)
            node.pulled.add(ref)
            node.reporter.poke()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    node.is_syncing = False
    node.reporter.update(set_status(refs, node.pulled, "Pinned"), is_final=True)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


async def run_strategy(
    kube: KubeCluster, names: list[str], *, paced: bool, args: argparse.Namespace
) -> dict[str, Any]:
    defaults = ClusterSettings()
    unpaced = 0.0001
    cluster = ClusterSettings(
        enabled=True,
        status_interval_s=(defaults.status_interval_s if paced else unpaced) / args.speed,
        progress_interval_s=(defaults.progress_interval_s if paced else unpaced) / args.speed,
        heartbeat_s=defaults.heartbeat_s / args.speed,
        events=False,
        request_timeout_s=60.0,
    )
    refs = [f"{REGISTRY}/ocp/release@sha256:{i:064x}" for i in range(args.images)]
    nodes: list[SimNode] = []
    for name in names:
        config = dataclasses.replace(
            Config.default(), cluster=dataclasses.replace(cluster, node_name=name)
        )
        api = CountingApi(
            kube.kubeconfig_for_node(name), timeout_s=60.0, field_manager=FIELD_MANAGER
        )
        holder: dict[str, SimNode] = {}

        def progress(h: dict[str, SimNode] = holder) -> PullProgress:
            return h["n"].progress()

        reporter = StatusReporter(config, api, Connection(api.server), progress=progress)
        node = SimNode(name, api, reporter)
        holder["n"] = node
        nodes.append(node)
    api_cpu0, etcd_cpu0 = cpu_seconds(kube.apiserver_pid), cpu_seconds(kube.etcd_pid)
    started = time.monotonic()
    tasks = [asyncio.create_task(n.reporter.run()) for n in nodes]
    await asyncio.gather(*(simulate(n, refs, args.concurrency, args.speed) for n in nodes))
    await drain(nodes, timeout_s=60.0)
    real_s = time.monotonic() - started
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    api_cpu, etcd_cpu = (
        cpu_seconds(kube.apiserver_pid) - api_cpu0,
        cpu_seconds(kube.etcd_pid) - etcd_cpu0,
    )
    for n in nodes:
        await n.api.close()
    virtual_min = real_s * args.speed / 60.0
    writes = [n.reporter.writes for n in nodes]
    return {
        "nodes": len(nodes),
        "real_s": round(real_s, 1),
        "virtual_min": round(virtual_min, 2),
        "writes": sum(writes),
        "writes_per_node_per_min": round(sum(writes) / len(nodes) / virtual_min, 2),
        "max_writes_one_node": max(writes),
        "conflicts": sum(n.api.conflicts for n in nodes),
        "failed_writes": sum(n.api.failures for n in nodes),
        "apiserver_cpu_s": round(api_cpu, 1),
        "etcd_cpu_s": round(etcd_cpu, 1),
        "apiserver_cores": round(api_cpu / real_s, 2),
        "apiserver_cpu_ms_per_node_virtual_min": round(
            1000 * api_cpu / len(nodes) / virtual_min, 2
        ),
    }


async def drain(nodes: list[SimNode], *, timeout_s: float) -> None:
    """Until every reporter has written its final (Pinned) status."""
    deadline = time.monotonic() + timeout_s

    def done(n: SimNode) -> bool:
        written: dict[str, Any] = n.reporter.pacer.last_written
        conditions = written.get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    while not all(done(n) for n in nodes):
        if time.monotonic() > deadline:
            raise RuntimeError("some reporters never wrote their final status")
        await asyncio.sleep(0.2)


def create_nodes(kube: KubeCluster, names: list[str]) -> None:
    items = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in names]
    doc = {"apiVersion": "v1", "kind": "List", "items": items}
    kube.kubectl_ok("apply", "--server-side", "-f", "-", input=json.dumps(doc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.status_scale")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--baseline-nodes", type=int, default=0, help="default: --nodes")
    parser.add_argument("--images", type=int, default=190)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--speed", type=float, default=4.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="nodeagent-bench-") as tmp,
        KubeCluster(Path(tmp) / "kube") as kube,
    ):
        install_deploy(kube)
        names = [f"bench-node-{i:04d}" for i in range(args.nodes)]
        base_names = [f"base-node-{i:04d}" for i in range(args.baseline_nodes or args.nodes)]
        create_nodes(kube, names + base_names)
        for name in names + base_names:
            kube.kubeconfig_for_node(name)
        results = {
            "nodeagent": asyncio.run(run_strategy(kube, names, paced=True, args=args)),
            "per-event": asyncio.run(run_strategy(kube, base_names, paced=False, args=args)),
        }
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "params": vars(args),
        "results": results,
        "ratios": ratios(results["nodeagent"], results["per-event"]),
    }
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def ratios(mine: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    pick: Callable[[dict[str, Any], str], float] = lambda r, k: float(r[k]) or 1e-9  # noqa: E731
    return {
        key: round(pick(mine, key) / pick(base, key), 3)
        for key in ("writes_per_node_per_min", "apiserver_cpu_ms_per_node_virtual_min")
    }


def render(report: dict[str, Any]) -> str:
    rows = ["strategy | nodes | writes/node/min | max writes/node | conflicts | failed | "
            "apiserver CPU s | etcd CPU s | apiserver ms/node/min"]  # fmt: skip
    for name, r in report["results"].items():
        rows.append(
            f"{name} | {r['nodes']} | {r['writes_per_node_per_min']} | "
            f"{r['max_writes_one_node']} | {r['conflicts']} | {r['failed_writes']} | "
            f"{r['apiserver_cpu_s']} | {r['etcd_cpu_s']} | "
            f"{r['apiserver_cpu_ms_per_node_virtual_min']}"
        )
    r = report["ratios"]
    rows.append(
        f"nodeagent / per-event: writes {r['writes_per_node_per_min']}, "
        f"apiserver CPU per node {r['apiserver_cpu_ms_per_node_virtual_min']}"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
