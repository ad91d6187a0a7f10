"""What ``bench/scale_fanout.py`` watches in a fan-out besides the stores: each daemon's
memory, each node's disk, each link's bytes over time, and when the log events that
bound the phases appeared; and the profile made of them (where the time between the
stick's attach and T_all went).

Sampled from outside while the run goes (``bench.fanout.Probe``), at the stores' poll
(0.25 s): the process tree of each node's daemon and peer server (``/proc/<pid>/task/*/
children``; CRI-O left out, it is not ours), whose ``VmHWM`` is read at every sample so a
child that ends early is counted; every ``LINK_EVERY`` polls (1 s), each node's link bytes
and its directory's disk use (``st_blocks`` of every file once per inode: the store, its
partials, CRI-O's storage on node 0); the log lines each node wrote since the last poll,
searched for ``EVENTS``.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.fanout_model import MB, MIB, Run, link_bytes_per_s
from bench.fanout_probe import link_bytes
from bench.prepull import status_kib
from tests.testenv.site_node import SiteNode

LINK_EVERY = 4
"""Polls (0.25 s each) between two samples of the links and the disks."""
EVENTS = (
    "store_copy_started",
    "store_copy_finished",
    "bundle_importing",
    "bundle_imported",
    "bundle_fetch_started",
    "bundle_fetched",
    "bundle_fetch_peer_dropped",
)
BUSY_SHARE = 0.8
"""A second in which a link carried at least this share of R counts as busy."""


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (those that exist now)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = [t.name for t in Path(f"/proc/{current}/task").iterdir()]
        except OSError:
            continue
        for task in tasks:
            try:
                text = Path(f"/proc/{current}/task/{task}/children").read_text()
            except OSError:
                continue
            todo += [int(c) for c in text.split()]
    return found


def process_name(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in raw if w]
    for verb in ("serve-peers", "serve-mirror", "mirror-session", "run"):
        if verb in words:
            return verb
    if not words:
        return "?"
    name = Path(words[0]).name
    return " ".join([name, *words[1:3]])[:48] if name.startswith("python") else name


def disk_bytes(root: Path) -> int:
    """Bytes allocated under ``root`` (each inode once, no link followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            try:
                info = os.lstat(f"{directory}/{name}")
            except OSError:
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


@dataclass
class NodeSamples:
    node: SiteNode
    peaks_kib: dict[int, tuple[str, int]] = field(default_factory=dict)
    """pid → (what it runs, its VmHWM in KiB at the last sample)."""
    disk_peak_bytes: int = 0
    disk_peak_s: float = 0.0
    links: list[tuple[float, int, int]] = field(default_factory=list)
    """(seconds since attach, bytes sent, bytes received) of its link."""
    held: list[tuple[float, int]] = field(default_factory=list)
    events: dict[str, float] = field(default_factory=dict)
    """First time (since attach) each of ``EVENTS`` was in the log."""
    log_offset: int = 0


class ScaleProbe:
    """``bench.fanout.Probe``: samples memory, disk, links and log events of every node."""

    def __init__(self) -> None:
        self.nodes: list[NodeSamples] = []
        self.since = 0.0
        self.polls = 0

    def started(self, nodes: list[SiteNode], since: float) -> None:
        self.since = since
        self.nodes = [NodeSamples(n) for n in nodes]
        for s in self.nodes:
            s.log_offset = s.node.log_path.stat().st_size if s.node.log_path.exists() else 0
        self._sample(with_links=True)

    def poll(self) -> None:
        self.polls += 1
        self._sample(with_links=self.polls % LINK_EVERY == 0)

    def ended(self, nodes: list[SiteNode]) -> None:
        self._sample(with_links=True)

    def _sample(self, *, with_links: bool) -> None:
        now = time.monotonic() - self.since
        for s in self.nodes:
            self._memory(s)
            self._log(s, now)
            if with_links:
                sent, received = link_bytes(s.node)
                s.links.append((now, sent, received))
                used = disk_bytes(s.node.root)
                if used > s.disk_peak_bytes:
                    s.disk_peak_bytes, s.disk_peak_s = used, now

    @staticmethod
    def _memory(s: NodeSamples) -> None:
        roots = [p.pid for p in (s.node.process, s.node.peer) if p is not None]
        for pid in (p for root in roots for p in descendants(root)):
            try:
                hwm = status_kib(pid, "VmHWM")
            except (OSError, KeyError):
                continue
            name = s.peaks_kib.get(pid, ("", 0))[0] or process_name(pid)
            s.peaks_kib[pid] = (name, max(hwm, s.peaks_kib.get(pid, ("", 0))[1]))

    @staticmethod
    def _log(s: NodeSamples, now: float) -> None:
        try:
            with s.node.log_path.open("rb") as log:
                log.seek(s.log_offset)
                data = log.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        s.log_offset += end
        text = data[:end].decode(errors="replace")
        for event in EVENTS:
            if event not in s.events and event in text:
                s.events[event] = now


# ---------------------------------------------------------------- the profile


def busy_seconds(links: list[tuple[float, int, int]], rate_mbit: float) -> tuple[float, float]:
    """Seconds in which the link received at >= ``BUSY_SHARE`` of R, and the seconds
    sampled between its first and last received byte."""
    rate = link_bytes_per_s(rate_mbit)
    busy = span = 0.0
    moving = [(a, b) for a, b in itertools.pairwise(links) if b[2] > a[2] + 64_000]
    if not moving:
        return 0.0, 0.0
    first, last = moving[0][0][0], moving[-1][1][0]
    for a, b in itertools.pairwise(links):
        if a[0] < first or b[0] > last or b[0] <= a[0]:
            continue
        dt = b[0] - a[0]
        span += dt
        if (b[2] - a[2]) / dt >= BUSY_SHARE * rate:
            busy += dt
    return busy, span


def windows(links: list[tuple[float, int, int]], step_s: float = 5.0) -> list[float]:
    """MB/s received in each ``step_s`` window from the attach (the samples nearest its ends)."""
    if len(links) < 2:
        return []
    out, start, end = [], 0.0, links[-1][0]
    while start < end:
        inside = [x for x in links if start <= x[0] <= start + step_s]
        if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
            rate = (inside[-1][2] - inside[0][2]) / (inside[-1][0] - inside[0][0])
            out.append(round(rate / MB, 1))
        start += step_s
    return out


def profile(run: Run, probe: ScaleProbe, s_over_r: float, rate_mbit: float) -> dict[str, Any]:
    """Where the time from the attach to T_all went, in seconds and in S/R."""
    node0 = probe.nodes[0].events
    copy_start = node0.get("store_copy_started")
    copy_end = node0.get("store_copy_finished")
    fetchers = run.per_node[1:]
    first_peer = min((n.first_byte_s for n in fetchers if n.first_byte_s is not None), default=None)
    ends = [n.complete_s for n in fetchers if n.complete_s is not None]
    nineties = [n.ninety_s for n in fetchers if n.ninety_s is not None]
    phases = {
        "attach_to_copy_start_s": copy_start,
        "stick_copy_s": None if copy_start is None or copy_end is None else copy_end - copy_start,
        "node0_holds_bundle_s": run.stick_s,
        "first_peer_byte_s": first_peer,
        "notice_s": None if first_peer is None else first_peer - run.stick_s,
        "fetch_started_s": sorted(
            s.events.get("bundle_fetch_started", -1.0) for s in probe.nodes[1:]
        ),
        "last_fetch_90pct_s": max(nineties, default=None),
        "tail_s": None if not ends or not nineties else max(ends) - max(nineties),
        "t_all_s": run.t_all_s,
        "node0_imported_s": node0.get("bundle_imported"),
    }
    per_node = []
    for s, n in zip(probe.nodes, run.per_node, strict=True):
        busy, span = busy_seconds(s.links, rate_mbit)
        per_node.append(
            {
                "node": n.index,
                "first_byte_s": n.first_byte_s,
                "complete_s": n.complete_s,
                "received_mb": round(n.received_bytes / MB, 1),
                "sent_mb": round(n.sent_bytes / MB, 1),
                "mean_rx_mb_s": (
                    round(n.received_bytes / MB / (n.complete_s - n.first_byte_s), 2)
                    if n.first_byte_s is not None and n.complete_s and n.complete_s > n.first_byte_s
                    else None
                ),
                "link_busy_s": round(busy, 1),
                "link_sampled_s": round(span, 1),
                "rx_mb_s_per_5s": windows(s.links),
                "events_s": {k: round(v, 2) for k, v in s.events.items()},
            }
        )
    in_s_over_r = {
        k: round(v / s_over_r, 3)
        for k, v in phases.items()
        if isinstance(v, float) and k != "t_all_s"
    }
    return {"phases_s": phases, "phases_in_s_over_r": in_s_over_r, "per_node": per_node}


def memory_and_disk(probe: ScaleProbe) -> list[dict[str, Any]]:
    out = []
    for i, s in enumerate(probe.nodes):
        peaks = sorted(s.peaks_kib.items(), key=lambda kv: -kv[1][1])
        out.append(
            {
                "node": i,
                "peak_rss_mib": round(max((k for _, (_, k) in peaks), default=0) / 1024, 1),
                "processes": [
                    {"pid": pid, "runs": name, "vmhwm_mib": round(kib / 1024, 1)}
                    for pid, (name, kib) in peaks
                ],
                "disk_peak_mib": round(s.disk_peak_bytes / MIB, 1),
                "disk_peak_at_s": round(s.disk_peak_s, 1),
            }
        )
    return out
