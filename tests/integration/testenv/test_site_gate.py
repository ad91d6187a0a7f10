"""The site gate with real daemons: ``nodeagent site wait`` before a cluster upgrade.

Cluster mode against the shared test API server (through ``ns_relay``), no static peers
(the nodes find each other in their published NodeImageHoldings), every node following
(``follow = auto`` in cluster mode):

* three nodes with CRI-O (``gate=crio``), the stick (a loop device) seen by node 0 only;
* one store-only node (``gate=small``) whose ``[store] max_bytes`` is smaller than the
  bundle: it refuses the fetch (``StoreFull``) and says so in its status;
* one Node object (``gate=silent``) in scope whose agent never starts: no status at all.

Two ``site wait`` commands start (the CLI, as an admin runs it, from the host) before the
stick is plugged: the one over every Node of the test must not open while the silent Node
and the refusing node are in scope, and ends at its timeout naming both (``no status``,
``failing: StoreFull``); the one over the three CRI-O nodes opens once, and only once,
the last of them reports the bundle pinned in its NodeImageStatus, which the test watches
through the API itself. ``site status`` names the refusing node with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.kube import KubeApi
from nodeagent.cluster.kinds import NODE_IMAGE_STATUS
from nodeagent.cluster.objects import FIELD_MANAGER
from nodeagent.errors import TransientError
from tests.integration.testenv.site_helpers import create_addressed_nodes, started_network
from tests.testenv.bundles import build_factory, ext4_media
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import install_deploy
from tests.testenv.ns_relay import KubeRelay
from tests.testenv.site_net import SiteNetUnavailable, SiteNetwork
from tests.testenv.site_node import SiteNode, stick_udevd
from tests.testenv.site_pki import make_ca
from tests.testenv.waiting import log_tail

pytestmark = pytest.mark.integration

BUNDLE = "line-3-test"
"""The id ``tests/testenv/bundles.build_factory`` gives its bundle."""
INTERVAL_S = "0.5"
"""``site wait --interval``: how often the commands read the API server."""
GATE_TIMEOUT_S = 75.0
"""The wait over every Node never opens: it ends at this timeout, after the three pinned."""
PIN_DEADLINE_S = 70.0
"""From the stick plugged to the three nodes pinned (measured: about 15 s)."""
LAG_S = 5.0
"""The gate opens within this long of the last node's pinned status (10 reads)."""


@dataclass
class Waiter:
    """A ``site wait`` subprocess, its stderr in a file, the moment it exited."""

    proc: subprocess.Popen[str]
    stderr: Path
    started_at: float = field(default_factory=time.monotonic)
    exited_at: float | None = None
    _watch: threading.Thread | None = field(default=None, repr=False)

    @classmethod
    def start(cls, cmd: list[str], stderr: Path) -> Waiter:
        with stderr.open("w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        waiter = cls(proc, stderr)
        waiter._watch = threading.Thread(target=waiter._wait_exit, daemon=True)
        waiter._watch.start()
        return waiter

    def _wait_exit(self) -> None:
        self.proc.wait()
        self.exited_at = time.monotonic()

    def is_running(self) -> bool:
        return self.exited_at is None

    def finish(self, timeout_s: float) -> tuple[int, str, str]:
        """Its exit code, stdout and stderr, once it exits (within ``timeout_s``)."""
        out, _ = self.proc.communicate(timeout=timeout_s)
        assert self._watch is not None
        self._watch.join(timeout_s)
        return self.proc.returncode, out, self.stderr.read_text()

    def kill(self) -> None:
        """Stop it if it still runs and close its stdout pipe (a test that failed before
        ``finish`` would leave it to the collector: a ResourceWarning in a later test)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def site_cmd(kube: KubeCluster, root: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "nodeagent", "--root", str(root), "site", *args,
        "--kubeconfig", str(kube.admin_kubeconfig),
    ]  # fmt: skip


def entry_of(status: dict[str, Any] | None) -> dict[str, Any]:
    """The node's furthest entry for the bundle in its NodeImageStatus (``{}``: none)."""
    entries = [
        e
        for e in ((status or {}).get("status") or {}).get("bundles") or []
        if e.get("bundleId") == BUNDLE
    ]
    return next((e for e in entries if e.get("state") == "pinned"), entries[-1] if entries else {})


@dataclass
class Observed:
    """What the test saw through the API: when each node was first seen pinned (the end of
    the read that showed it), and each read that began after the gate had exited (each must
    show all three pinned: the gate opened only once they all were, to within one read of
    the test, about 0.1 s)."""

    pinned_at: dict[str, float] = field(default_factory=dict)
    reads_after_exit: list[tuple[float, frozenset[str]]] = field(default_factory=list)
    """(when the read began, the nodes it showed pinned)."""
    refusal: dict[str, Any] = field(default_factory=dict)


async def watch_statuses(
    kube: KubeCluster,
    *,
    agents: list[str],
    refuser: str,
    gate: Waiter,
    others: list[Waiter],
    nodes: list[SiteNode],
) -> Observed:
    """Read every NodeImageStatus until the three agents are pinned, the refuser refuses
    and the gate has exited; the wait over every Node must still run then."""
    seen = Observed()
    api = KubeApi(kube.admin_kubeconfig, timeout_s=10, field_manager=FIELD_MANAGER)
    deadline = time.monotonic() + PIN_DEADLINE_S
    try:
        while True:
            exited_before = gate.exited_at  # known before the read starts
            started = time.monotonic()
            objects, _ = await api.list(NODE_IMAGE_STATUS)
            now = time.monotonic()
            statuses = {o["metadata"]["name"]: o for o in objects}
            pinned = frozenset(
                n for n in agents if entry_of(statuses.get(n)).get("state") == "pinned"
            )
            for name in pinned:
                seen.pinned_at.setdefault(name, now)
            refused = entry_of(statuses.get(refuser))
            if refused.get("reason") == "StoreFull" and not seen.refusal:
                seen.refusal = refused
            if exited_before is not None:
                seen.reads_after_exit.append((started, pinned))
            for waiter in others:
                assert waiter.is_running(), "the wait over every Node ended early:\n" + (
                    waiter.stderr.read_text()
                )
            for node in nodes:
                node._check_running()
            if len(pinned) == len(agents) and seen.refusal and seen.reads_after_exit:
                return seen
            if now > deadline:
                raise AssertionError(
                    f"after {PIN_DEADLINE_S:.0f} s: pinned {sorted(pinned)}, refusal "
                    f"{seen.refusal or refused}, gate exited: {gate.exited_at is not None}\n"
                    + "\n".join(f"{n.name}:\n{log_tail(n.log_path)}" for n in nodes)
                    + f"\ngate:\n{gate.stderr.read_text()}"
                )
            await asyncio.sleep(0.1)
    finally:
        await api.close()


@contextlib.contextmanager
def site_network(tmp_path: Path, count: int) -> Iterator[tuple[SiteNetwork, Any]]:
    with started_network(count) as network:
        try:
            udevd = stick_udevd(tmp_path / "udevd", network.hosts[0])
        except SiteNetUnavailable as exc:
            pytest.skip(str(exc))
        with udevd:
            yield network, udevd


def assert_names_refusal(lines: str, refuser: str) -> None:
    assert f"  {refuser}: failing: StoreFull: " in lines, lines
    assert "[store] max_bytes" in lines, lines


FIRST_LOOK_S = 3.0
"""The wait's first look at the API has printed by then (it polls every INTERVAL_S)."""


def check_gate(gate: Waiter, seen: Observed, agents: list[str]) -> tuple[float, float]:
    """The gate over the three opened after the last pinned, and soon after: its lag, and
    how soon after its exit the test's first read began (the check's resolution)."""
    code, out, err = gate.finish(10)
    assert code == 0, err
    assert out.strip() == f"bundle {BUNDLE}: 3/3 nodes pinned, 3 holding, 0 failing"
    assert gate.exited_at is not None
    assert seen.reads_after_exit
    for started, pinned in seen.reads_after_exit:
        assert started >= gate.exited_at
        assert len(pinned) == len(agents), (
            f"the gate exited while the API showed only {sorted(pinned)} pinned"
        )
    resolution_s = seen.reads_after_exit[0][0] - gate.exited_at
    lag_s = gate.exited_at - max(seen.pinned_at.values())
    assert lag_s < LAG_S, f"the gate opened {lag_s:.1f} s after the last node pinned"
    # while it waited it named each of the three as not pinned yet
    assert err.startswith("waiting: bundle "), err
    # (a node that pinned before the wait's first look is not named: with the fan-out as
    # fast as it is now, all three may have pinned by then)
    late = [a for a in agents if seen.pinned_at[a] > gate.started_at + FIRST_LOOK_S]
    assert all(f"  {a}: " in err for a in late), err
    return lag_s, resolution_s


def check_site_status(
    kube: KubeCluster, root: Path, *, everyone: str, agents: list[str], refuser: str, silent: str
) -> None:
    """``site status`` names the refusing node with its reason, and the silent one."""
    status = subprocess.run(
        site_cmd(kube, root, "status", "--bundle", BUNDLE, "--selector", everyone),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    text = status.stdout
    assert text.startswith("5 nodes in scope, 4 reporting\n"), text
    assert f"no status: {silent}\n" in text, text
    assert f"bundle {BUNDLE}: 3/5 nodes pinned, 3 holding, 1 failing" in text, text
    assert_names_refusal(text, refuser)
    assert f"  {silent}: no status (nodeagent never reported" in text, text
    as_json = subprocess.run(
        site_cmd(kube, root, "status", "--bundle", BUNDLE, "--selector", everyone, "--json"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    (view,) = json.loads(as_json.stdout)["bundles"]
    assert view["complete"] is False
    assert sorted(view["pinned"]) == sorted(agents)
    (failing,) = view["failing"]
    assert (failing["node"], failing["verdict"], failing["reason"]) == (
        refuser,
        "failing",
        "StoreFull",
    )
    assert "[store] max_bytes" in failing["message"]
    laggards = {n["node"]: n for n in view["laggards"]}
    assert sorted(laggards) == sorted([refuser, silent])
    assert laggards[silent]["verdict"] == "no-status"


def check_wait_over_everyone(every: Waiter, agents: list[str], refuser: str, silent: str) -> float:
    """Still closed; ends at its timeout (75) naming the silent and the refusing node."""
    assert every.is_running(), every.stderr.read_text()
    code, out, err = every.finish(GATE_TIMEOUT_S + 30)
    assert every.exited_at is not None
    ran_s = every.exited_at - every.started_at
    assert ran_s >= GATE_TIMEOUT_S
    assert code == TransientError.exit_code, err
    assert out == ""
    final = err.rsplit("error: timed out", 1)
    assert len(final) == 2, err
    assert final[1].startswith(f" after {GATE_TIMEOUT_S:g} s: bundle {BUNDLE}: 3/5 "), err
    assert f"  {silent}: no status (nodeagent never reported" in final[1], err
    assert_names_refusal(final[1], refuser)
    assert not any(f"  {a}: " in final[1] for a in agents), err
    return ran_s


@pytest.mark.timeout(300)
def test_site_wait_opens_when_the_last_node_pins_and_never_with_a_silent_or_refusing_node(
    kube: KubeCluster, tmp_path: Path
) -> None:
    install_deploy(kube)
    run = uuid.uuid4().hex[:8]
    factory = build_factory(tmp_path / "factory", count=2, layer_bytes=1 << 20, seed=15)
    ca = make_ca("site CA")
    agents = [f"gate-{run}-{i}" for i in range(3)]
    refuser, silent = f"gate-{run}-small", f"gate-{run}-silent"
    roles = {**dict.fromkeys(agents, "crio"), refuser: "small", silent: "silent"}
    everyone, three = f"sitegate={run}", f"sitegate={run},gate=crio"
    with (
        site_network(tmp_path, 4) as (net, _),
        KubeRelay(kube.port, [h.netns for h in net.hosts], tmp_path / "relay.log"),
    ):
        labels = {name: {"sitegate": run, "gate": role} for name, role in roles.items()}
        create_addressed_nodes(kube, zip([*agents, refuser], net.hosts, strict=True), labels)
        kube.create_node(silent, labels[silent])  # no host: it never answers
        nodes = [
            SiteNode(
                tmp_path / name,
                host,
                name=name,
                ca=ca,
                with_crio=name != refuser,
                has_stick=host.index == 0,
                trusted_keys=[factory.public_key],
                kubeconfig=kube.kubeconfig_for_node(name),
                extra_config='[store]\nmax_bytes = "1MiB"\n' if name == refuser else "",
            )
            for name, host in zip([*agents, refuser], net.hosts, strict=True)
        ]
        waiters: list[Waiter] = []
        try:
            with ext4_media(tmp_path, factory.bundle) as media:
                for node in nodes:
                    node.start(ready="media_watch_started" if node.has_stick else "daemon_started")
                wait = ("wait", "--bundle", BUNDLE, "--interval", INTERVAL_S)
                every = Waiter.start(
                    site_cmd(
                        kube, tmp_path, *wait, "--selector", everyone,
                        "--timeout", str(GATE_TIMEOUT_S),
                    ),
                    tmp_path / "wait-every.stderr",
                )  # fmt: skip
                waiters.append(every)
                gate = Waiter.start(
                    site_cmd(kube, tmp_path, *wait, "--selector", three, "--timeout", "300"),
                    tmp_path / "wait-three.stderr",
                )
                waiters.append(gate)
                plugged = time.monotonic()
                media.attach()
                seen = asyncio.run(
                    watch_statuses(
                        kube, agents=agents, refuser=refuser, gate=gate, others=[every],
                        nodes=nodes,
                    )
                )  # fmt: skip
                lag_s, resolution_s = check_gate(gate, seen, agents)
                check_site_status(
                    kube, tmp_path, everyone=everyone, agents=agents, refuser=refuser, silent=silent
                )
                ran_s = check_wait_over_everyone(every, agents, refuser, silent)
            times = ", ".join(f"{n} {t - plugged:.1f} s" for n, t in sorted(seen.pinned_at.items()))
            print(
                f"pinned after the stick: {times}; the gate opened {lag_s:.2f} s after the last "
                f"(interval {INTERVAL_S} s; the test read again {resolution_s:.2f} s after it "
                f"exited); the wait over every Node ended after {ran_s:.1f} s "
                f"(timeout {GATE_TIMEOUT_S:g} s)"
            )
        finally:
            for waiter in waiters:
                waiter.kill()
            for node in nodes:
                node.close()
            kube.kubectl("delete", "node", *roles, "--wait=false")
