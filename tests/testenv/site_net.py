"""A site's network on this machine: N node namespaces on one bridge, links shaped with tc.

``SiteNetwork(n, rate_mbit=None, delay_ms=None)`` builds, entirely inside network
namespaces it creates (nothing is added to the host's namespace)::

    nodeagent-site-<token>-sw     the switch: bridge br0, ports p0 .. p<n-1>
    nodeagent-site-<token>-<i>    node i: lo (up) and eth0, the other end of p<i>,
                                  address 198.19.<k>.<i + 10>/24

``token`` is ``<owner pid>x<6 hex digits>``: a later run sweeps namespaces of this prefix
whose owner process is gone (``sweep_stale``), so a killed test run leaves nothing behind
for long. Addresses come from 198.19.0.0/16, the upper half of 198.18.0.0/15 (the range
RFC 2544 sets aside for benchmarking network devices); ``link.py`` takes the lower half,
198.18.0.0/16, so the two never collide. A /24 holding any address the host's namespace
uses is never picked. The nodes have no route beyond the /24 and the switch namespace no
address at all: nothing is routed out of the site.

Shaping (``rate_mbit``): one ``tbf`` qdisc on each end of each node's veth pair, i.e. on
the node's eth0 (what it sends) and on its switch port (what it receives), so every node
has its own access link of that rate each way, as a node behind a switch port has.
``delay_ms`` needs ``sch_netem`` (one-way delay added on the switch port, so a round trip
between two nodes sees ``2 * delay_ms``); this machine's kernel has none
(``CONFIG_NET_SCH_NETEM`` unset; neither ``fq`` nor ``etf``, which could delay by departure
time), so asking for a delay raises ``SiteNetUnavailable`` naming it. ``link.py`` adds
latency with a userspace delay line between TUN devices instead; a TAP variant of that line
could do the same on a bridge at a cost in CPU the two cores cannot spare for a benchmark.

Every missing kernel part (bridge, veth, tbf, netem) raises ``SiteNetUnavailable`` with the
component's name, which tests turn into a skip reason. Teardown stops every process still
inside the namespaces (processes the harness started there), then deletes the namespaces;
the veth pairs and the bridge vanish with them. It runs after a failed start too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.testenv.lifecycle import Service
from tests.testenv.packages import ensure_packages
from tests.testenv.waiting import wait_for

IP = "/usr/sbin/ip"
TC = "/usr/sbin/tc"
PREFIX = "nodeagent-site-"
SITE_RANGE = ipaddress.IPv4Network("198.19.0.0/16")
"""Upper half of RFC 2544's 198.18.0.0/15; ``link.py`` uses the lower half."""
FIRST_HOST = 10
"""Node i's address is ``.<FIRST_HOST + i>`` in the network's /24."""
MAX_NODES = 64
TBF_BURST_BYTES = 256 * 1024
"""Above the largest GSO segment (64 KiB) a veth hands over, so tbf never splits one."""
TBF_LATENCY_MS = 100
"""How long a packet may wait in a tbf queue before it is dropped (bounds the queue)."""
_STALE = re.compile(rf"^{re.escape(PREFIX)}(\d+)x[0-9a-f]{{6}}-(sw|\d+)$")


class SiteNetUnavailable(RuntimeError):
    """A kernel part the site network needs is missing; the message names it, after the
    capability probe it stands for (``[probe site-net]``, ``netem`` or ``own-udevd``:
    tests/capabilities.py), so a test that skips on it says why in the terms ``make test``
    judges its skips by."""

    def __init__(self, message: str, *, probe: str = "site-net") -> None:
        super().__init__(f"[probe {probe}] {message}")
        self.probe = probe


def _run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def _try(component: str, *args: str) -> None:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SiteNetUnavailable(
            f"{component} is not available in this kernel: {' '.join(args)}: "
            f"{result.stderr.strip()}",
            probe="netem" if "netem" in component else "site-net",
        )


def netns_names() -> list[str]:
    """Every named network namespace (``ip netns list``), without its id."""
    return [line.split()[0] for line in _run(IP, "netns", "list").splitlines() if line.strip()]


def host_addresses() -> set[ipaddress.IPv4Address]:
    found = re.findall(r"inet (\d+\.\d+\.\d+\.\d+)", _run(IP, "-o", "-4", "addr", "show"))
    return {ipaddress.IPv4Address(a) for a in found}


def _is_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def delete_netns(name: str) -> None:
    """Stop every process inside ``name`` (SIGKILL, by pid) and delete it."""
    pids = [int(p) for p in _run(IP, "netns", "pids", name).split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: not any(map(_is_alive, pids)),
        timeout_s=10,
        what=f"the processes in {name} to exit",
    )
    subprocess.run([IP, "netns", "delete", name], capture_output=True, check=False)


def sweep_stale() -> list[str]:
    """Delete the site namespaces whose owner process is gone; return their names."""
    swept = []
    for name in netns_names():
        match = _STALE.match(name)
        if match is not None and not _is_alive(int(match.group(1))):
            delete_netns(name)
            swept.append(name)
    return swept


@dataclass(frozen=True)
class SiteHost:
    """One node's place on the site network."""

    index: int
    netns: str
    address: str

    @property
    def exec_prefix(self) -> list[str]:
        """Prepend to a command to run it inside this node's namespace."""
        return [IP, "netns", "exec", self.netns]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.exec_prefix, *args], capture_output=True, text=True, check=check
        )


class SiteNetwork(Service):
    """``n`` node namespaces on one bridge; ``with SiteNetwork(3) as net: net.hosts[1].address``."""

    def __init__(
        self, n: int, *, rate_mbit: float | None = None, delay_ms: float | None = None
    ) -> None:
        if not 1 <= n <= MAX_NODES:
            raise ValueError(f"a site network has 1 to {MAX_NODES} nodes, not {n}")
        if (rate_mbit is not None and rate_mbit <= 0) or (delay_ms is not None and delay_ms < 0):
            raise ValueError(f"rate_mbit must be > 0 and delay_ms >= 0: {rate_mbit}, {delay_ms}")
        self.n = n
        self.rate_mbit = rate_mbit
        self.delay_ms = delay_ms
        self.token = f"{os.getpid()}x{secrets.token_hex(3)}"
        self.switch = f"{PREFIX}{self.token}-sw"
        self.network = ipaddress.IPv4Network("0.0.0.0/32")
        self.hosts: list[SiteHost] = []

    @property
    def namespaces(self) -> list[str]:
        return [self.switch, *(h.netns for h in self.hosts)]

    def _pick_network(self) -> ipaddress.IPv4Network:
        in_use = host_addresses()
        subnets = list(SITE_RANGE.subnets(new_prefix=24))
        for _ in range(100):
            candidate = subnets[secrets.randbelow(len(subnets))]
            if not any(a in candidate for a in in_use):
                return candidate
        raise RuntimeError(f"no /24 in {SITE_RANGE} is free of the host's addresses")

    def start(self) -> None:
        ensure_packages({"iproute2": IP})
        sweep_stale()
        self.network = self._pick_network()
        base = self.network.network_address
        self.hosts = [
            SiteHost(i, f"{PREFIX}{self.token}-{i}", str(base + FIRST_HOST + i))
            for i in range(self.n)
        ]
        try:
            self._build()
        except BaseException:
            self.stop()
            raise

    def _build(self) -> None:
        _run(IP, "netns", "add", self.switch)
        sw = ["-n", self.switch]
        _try("the bridge driver (CONFIG_BRIDGE)", IP, *sw, "link", "add", "br0", "type", "bridge")
        _run(IP, *sw, "link", "set", "br0", "up")
        for host in self.hosts:
            self._attach(host)
        if self.delay_ms is not None:
            self._delay()

    def _attach(self, host: SiteHost) -> None:
        _run(IP, "netns", "add", host.netns)
        ns, port = ["-n", host.netns], f"p{host.index}"
        _try("veth pairs (CONFIG_VETH)", IP, *ns, "link", "add", "eth0", "type", "veth",
             "peer", "name", port, "netns", self.switch)  # fmt: skip
        _run(IP, "-n", self.switch, "link", "set", port, "master", "br0", "up")
        _run(IP, *ns, "addr", "add", f"{host.address}/{self.network.prefixlen}", "dev", "eth0")
        _run(IP, *ns, "link", "set", "eth0", "up")
        _run(IP, *ns, "link", "set", "lo", "up")
        if self.rate_mbit is not None:
            tbf = ["tbf", "rate", f"{self.rate_mbit:g}mbit", "burst", str(TBF_BURST_BYTES)]
            tbf += ["latency", f"{TBF_LATENCY_MS}ms"]
            what = "the tbf qdisc (CONFIG_NET_SCH_TBF)"
            _try(what, TC, *ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", *tbf)
            _try(what, TC, "-n", self.switch, "qdisc", "add", "dev", port,
                 "root", "handle", "1:", *tbf)  # fmt: skip

    def _delay(self) -> None:
        """netem on each switch port, under its tbf when there is one (not on this machine)."""
        parent = ["parent", "1:1"] if self.rate_mbit is not None else ["root"]
        for host in self.hosts:
            _try("the netem qdisc (CONFIG_NET_SCH_NETEM), needed for delay_ms",
                 TC, "-n", self.switch, "qdisc", "add", "dev", f"p{host.index}", *parent,
                 "handle", "10:", "netem", "delay", f"{self.delay_ms:g}ms")  # fmt: skip

    def close(self) -> None:
        """``stop``, for ``contextlib.closing`` around a network started by hand."""
        self.stop()

    def stop(self) -> None:
        """Delete every namespace of this network (and so its links), whatever state it is in."""
        existing = set(netns_names())
        failures = []
        for name in reversed(self.namespaces):
            if name in existing:
                try:
                    delete_netns(name)
                except (
                    AssertionError,
                    subprocess.CalledProcessError,
                ) as exc:  # the others still go
                    failures.append(f"{name}: {exc}")
        if failures:
            raise RuntimeError("site network not torn down:\n" + "\n".join(failures))
