"""The pure part of ``bench/mirror.py``: its figures, their ratios and goals, and the table.

Every ratio is of two figures measured in the same run (the node mirror and docker-registry
alternate within each round; the link's rate is the one ``tbf`` enforces in that run).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

MB = 1_000_000
GB = 1_000_000_000
MIB = 1 << 20
PULL_GOAL = 1.05
"""CRI-O's pull from the node mirror, at most this times its pull from docker-registry."""
LINK_GOAL = 0.9
"""Bytes a peer serves over a shaped link, at least this share of the link's rate."""
BUDGET_MIB = 40.0
"""The idle budget of the reference node (docs/performance.md, "Idle memory")."""
NODE_MIRROR = "node-mirror"
REGISTRY = "docker-registry"
NODE_MIRROR_AGAIN = "node-mirror-again"
"""The same pull again from the same node mirror process: every blob was verified by the
first one, so this one is ``sendfile`` alone (``adapters/http/content.py``)."""
PEER_SERVER = "peer-server"
"""The peer server (``nodeagent serve-peers``, mutual TLS) over the shaped link, fetched
blob after blob by ``curl`` in the other node's namespace."""
LINK_MODES = (PEER_SERVER,)
"""What can be measured over the link. The node mirror of a node fetching from a peer
(issue 25, item 4) is one more mode once it exists."""


@dataclass(frozen=True)
class Pull:
    """One fresh CRI-O pulling every image of the set from one source, image after image."""

    source: str
    round_no: int
    wall_s: float
    bytes_pulled: int
    crio_cpu_s: float
    server_cpu_s: float
    machine_cpu_s: float
    load: float
    """The 1-minute load average when the pull started."""

    @property
    def mb_s(self) -> float:
        return self.bytes_pulled / MB / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class Transfer:
    """Bytes served over the shaped link, from the first request to the last byte."""

    mode: str
    round_no: int
    wall_s: float
    bytes_served: int
    rate_mbit: float
    server_cpu_s: float
    load: float

    @property
    def mbit_s(self) -> float:
        return self.bytes_served * 8 / 1e6 / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def share(self) -> float:
        """The rate reached over the link's rate."""
        return self.mbit_s / self.rate_mbit if self.rate_mbit > 0 else 0.0


@dataclass(frozen=True)
class Figures:
    size_bytes: int
    images: int
    blobs: int
    pulls: tuple[Pull, ...] = ()
    transfers: tuple[Transfer, ...] = ()
    peer_idle_rss_mib: float | None = None
    """The peer process serving the node mirror, the store full, before its first request
    (the median over the rounds: a process is started for each)."""
    peer_busy_rss_mib: float | None = None
    """Its peak after the pulls (VmHWM, the largest over the rounds)."""
    notes: list[str] = field(default_factory=list)


def pull_ratios(pulls: Sequence[Pull], source: str = NODE_MIRROR) -> list[float]:
    """Per round: ``source``'s wall time over docker-registry's (rounds missing one: none)."""
    by_round: dict[int, dict[str, float]] = {}
    for p in pulls:
        by_round.setdefault(p.round_no, {})[p.source] = p.wall_s
    return [
        r[source] / r[REGISTRY]
        for _, r in sorted(by_round.items())
        if source in r and r.get(REGISTRY, 0.0) > 0
    ]


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def verdict(value: float | None, goal: float, *, at_most: bool) -> str:
    if value is None:
        return "not measured"
    met = value <= goal if at_most else value >= goal
    return "pass" if met else "MISS"


def _pull_lines(pulls: Sequence[Pull]) -> list[str]:
    lines = [
        "source            round   wall s    MB/s   CRI-O CPU s  server CPU s  machine CPU s  load"
    ]
    for p in pulls:
        lines.append(
            f"{p.source:<17} {p.round_no:>5} {p.wall_s:8.2f} {p.mb_s:7.1f} {p.crio_cpu_s:12.1f}"
            f" {p.server_cpu_s:13.1f} {p.machine_cpu_s:14.1f}  {p.load:4.2f}"
        )
    return lines


def _transfer_lines(transfers: Sequence[Transfer]) -> list[str]:
    lines = [
        "link mode         round   wall s      MB   Mbit/s  link Mbit/s  share  server CPU s  load"
    ]
    for t in transfers:
        lines.append(
            f"{t.mode:<17} {t.round_no:>5} {t.wall_s:8.2f} {t.bytes_served / MB:7.1f}"
            f" {t.mbit_s:8.2f} {t.rate_mbit:12g} {t.share:6.3f} {t.server_cpu_s:13.1f}"
            f"  {t.load:4.2f}"
        )
    return lines


def checks(fig: Figures) -> list[tuple[str, float | None, str, str]]:
    """(what, value, goal, verdict) for each of the benchmark's goals."""
    ratio = median_or_none(pull_ratios(fig.pulls))
    again = median_or_none(pull_ratios(fig.pulls, NODE_MIRROR_AGAIN))
    share = median_or_none([t.share for t in fig.transfers])
    rss = fig.peer_idle_rss_mib
    return [
        ("pull: node mirror (first requests) / docker-registry (median of rounds)", ratio,
         f"<= {PULL_GOAL}", verdict(ratio, PULL_GOAL, at_most=True)),
        ("pull again: node mirror (blobs verified) / docker-registry (median)", again,
         f"<= {PULL_GOAL}", verdict(again, PULL_GOAL, at_most=True)),
        ("peer server over the shaped link / link rate (median)", share, f">= {LINK_GOAL}",
         verdict(share, LINK_GOAL, at_most=False)),
        ("peer process serving the node mirror, idle RSS MiB (the budget is the daemon's;"
         " shown against it)", rss, f"<= {BUDGET_MIB}",
         verdict(rss, BUDGET_MIB, at_most=True)),
    ]  # fmt: skip


def render(fig: Figures, header: Sequence[str]) -> str:
    lines = [*header]
    lines.append(f"set: {fig.images} images, {fig.blobs} blobs, {fig.size_bytes / GB:.3f} GB")
    if fig.pulls:
        lines += ["", *_pull_lines(fig.pulls)]
        for source in (NODE_MIRROR, NODE_MIRROR_AGAIN):
            ratios = ", ".join(f"{r:.3f}" for r in pull_ratios(fig.pulls, source))
            lines.append(f"{source} / docker-registry per round: {ratios or '-'}")
    if fig.transfers:
        lines += ["", *_transfer_lines(fig.transfers)]
    if fig.peer_busy_rss_mib is not None:
        lines.append(
            f"\npeer process peak RSS (VmHWM) after the pulls: {fig.peer_busy_rss_mib:.2f} MiB"
        )
    lines.append("")
    for what, value, goal, result in checks(fig):
        shown = "-" if value is None else f"{value:.3f}"
        lines.append(f"{what}: {shown} (goal {goal}): {result}")
    lines += [f"note: {n}" for n in fig.notes]
    return "\n".join(lines)
