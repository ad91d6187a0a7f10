"""An emulated network link: a private network namespace behind a TUN pair with latency.

``EmulatedLink(rtt_ms=50, rate_mbit=None)`` creates the network namespace
``nodeagent-link-<token>`` and connects it to the host's namespace by a
point-to-point link between two TUN devices, one in each namespace; the
delay-line process ``tests/testenv/wire.py`` carries the packets and adds
``rtt_ms / 2`` in each direction. ``rate_mbit`` adds a ``tbf`` qdisc on both
TUN devices (the same rate each way). A server started with ``exec_prefix``
(``ip netns exec <name>``) and bound to ``netns_address`` is reachable from
the host at that address, and only through the link. Only this namespace and
the point-to-point link carry traffic: nothing is routed beyond them.

Addresses come from 198.18.0.0/15, the range RFC 2544 sets aside for
benchmarking network devices; a pair in use on the host is never reused.

Why TUN and a userspace delay line, not a veth pair with ``tc netem``: the
kernel may be built without ``sch_netem`` (this machine's is), while TUN and
``tbf`` are nearly always there. See ``wire.py`` for what the line models.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import IO

from tests.testenv.lifecycle import Service
from tests.testenv.packages import ensure_packages

IP = "/usr/sbin/ip"
TC = "/usr/sbin/tc"
TBF_BURST_BYTES = 256 * 1024
"""Above the largest TSO segment (64 KiB) the TUN devices hand over, so tbf never splits one."""


def _run(*args: str) -> str:
    result = subprocess.run(args, check=True, capture_output=True, text=True)
    return result.stdout


def _addresses_in_use() -> set[str]:
    return set(re.findall(r"\d+\.\d+\.\d+\.\d+", _run(IP, "-o", "addr", "show")))


class EmulatedLink(Service):
    """A network namespace one ``rtt_ms`` round trip (and ``rate_mbit``) away from the host."""

    def __init__(self, workdir: Path, *, rtt_ms: float, rate_mbit: float | None = None) -> None:
        if rtt_ms < 0 or (rate_mbit is not None and rate_mbit <= 0):
            raise ValueError(f"rtt_ms must be >= 0 and rate_mbit > 0: {rtt_ms}, {rate_mbit}")
        self.workdir = workdir
        self.rtt_ms = rtt_ms
        self.rate_mbit = rate_mbit
        token = secrets.token_hex(3)
        self.netns = f"nodeagent-link-{token}"
        self.host_device = f"nal{token}h"
        self.netns_device = f"nal{token}n"
        self.host_address, self.netns_address = self._pick_addresses()
        self.log_path = workdir / "wire.log"
        self._wire: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None

    @property
    def exec_prefix(self) -> list[str]:
        """Prepend to a command to run it inside the namespace."""
        return [IP, "netns", "exec", self.netns]

    @property
    def wire_pid(self) -> int | None:
        return self._wire.pid if self._wire is not None else None

    def _pick_addresses(self) -> tuple[str, str]:
        in_use = _addresses_in_use()
        for _ in range(100):
            third, fourth = secrets.randbelow(256), 2 * secrets.randbelow(127) + 1
            host, peer = f"198.18.{third}.{fourth}", f"198.18.{third}.{fourth + 1}"
            if not {host, peer} & in_use:
                return host, peer
        raise RuntimeError("no free address pair in 198.18.0.0/16")

    def start(self) -> None:
        ensure_packages({"iproute2": IP})
        self.workdir.mkdir(parents=True, exist_ok=True)
        _run(IP, "netns", "add", self.netns)
        try:
            self._start_wire()
            self._configure()
        except BaseException:
            self.stop()
            raise

    def _start_wire(self) -> None:
        self._log = self.log_path.open("w")
        delay_ms = f"{self.rtt_ms / 2:g}"
        cmd = [sys.executable, "-m", "tests.testenv.wire", self.host_device, self.netns]
        self._wire = subprocess.Popen(
            [*cmd, self.netns_device, delay_ms],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert self._wire.stdout is not None
        line = self._wire.stdout.readline()
        if line.strip() != "ready":
            self._wire.wait()
            raise RuntimeError(f"the link's wire did not start:\n{self.log_path.read_text()}")

    def _configure(self) -> None:
        ns = ["-n", self.netns]
        _run(IP, "addr", "add", self.host_address, "peer", self.netns_address,
             "dev", self.host_device)  # fmt: skip
        _run(IP, *ns, "addr", "add", self.netns_address, "peer", self.host_address,
             "dev", self.netns_device)  # fmt: skip
        _run(IP, "link", "set", self.host_device, "up")
        _run(IP, *ns, "link", "set", self.netns_device, "up")
        _run(IP, *ns, "link", "set", "lo", "up")
        if self.rate_mbit is not None:
            tbf = ["root", "tbf", "rate", f"{self.rate_mbit:g}mbit"]
            tbf += ["burst", str(TBF_BURST_BYTES), "latency", "100ms"]
            _run(TC, "qdisc", "add", "dev", self.host_device, *tbf)
            _run(TC, *ns, "qdisc", "add", "dev", self.netns_device, *tbf)

    def stop(self) -> None:
        """Stop the wire (its TUN devices vanish with it) and delete the namespace."""
        wire, self._wire = self._wire, None
        if wire is not None:
            wire.terminate()
            try:
                wire.wait(timeout=5)
            except subprocess.TimeoutExpired:
                wire.kill()
                wire.wait()
            if wire.stdout is not None:
                wire.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None
        if Path(f"/run/netns/{self.netns}").exists():
            _run(IP, "netns", "delete", self.netns)
