"""The fan-out benchmark's arithmetic: the bundle's shape, the model of T_all, the report.

Pure functions over measured values (no I/O), so ``tests/unit/bench/test_fanout_model.py``
checks them with small numbers; ``bench/fanout.py`` measures and calls them.

The model (docs/performance.md, "Site fan-out"), for a bundle of S bytes whose largest blob
is c bytes, N nodes whose links carry r bytes/s each way::

    T_all(N)  = T_stick + d + S / r + (G(N) - 1) * g
    G(N)      = ceil(log(N) / log(k)),  k = 1 + min(U, F) / F
    T_base(N) = T_stick + d + (N - 1) * S / r0            (every node from node 0 alone)

* ``T_stick``: node 0's stick copy, from the stick's arrival until node 0's store holds the
  bundle. Peers start only then: a bundle is offered once its record is written.
* ``d``: the notice delay, from node 0 holding the bundle until the first peer's first byte
  (holdings poll, the signed manifest fetched and checked).
* ``S / r``: a node's own download; no node takes the bundle in faster than its link.
  ``r`` is calibrated on the 2-node fan-out (one sender, one receiver: the link's goodput
  with TLS and verification): the median over its fetching nodes of bytes held over the
  time from their first to their last byte; without that run, node 0's upload rate in the
  all-from-node-0 runs. Larger fan-outs are not used for r: where sources are short, their
  nodes' rates measure the shortage, not the link.
* ``G(N) - 1`` generations: each blob spreads as a tree. A generation is the time ``g`` a
  node needs to hold a whole blob it can pass on; in each, every holder starts up to
  ``min(U, F)`` new downloads at ``r / F`` each (it serves at most U = ``max_uploads`` at once;
  a fetcher takes F = ``fetch_concurrency`` blobs at once, sharing its link), so holders grow
  by ``k`` (2 when U >= F). The blobs follow each other down the tree (pipelined), so the
  depth is paid once, not once per blob. Theory: ``g = F * c / r``; calibrated: least squares
  of each fan-out run's residual ``T_all - T_stick - d - S / r`` against ``G(N) - 1``.
* ``r0``: node 0's upload rate in the all-from-node-0 runs; its link carries every copy.

Assumptions: equal links each way, and the links (not CPU, disk or TLS) set the pace; the
fetchers keep their F slots busy with blobs some peer holds (a node never idles for lack of
something to fetch); no upload cap (``upload_max_bytes`` = 0; with a cap C read ``r`` as
min(r, C)); discovery traffic is left out (hundreds of nodes: docs/site.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MB = 1_000_000
GB = 1_000_000_000
MIB = 1 << 20
MIN_BLOBS = 32
"""Issue 15: the bundle comes in at least 32 blobs ..."""
MAX_BLOB_SHARE = 16
"""... the largest at most S/16."""
RSS_BUDGET_MIB = 40.0
SCALE_NODES = (100, 1000)
FANOUT = "fanout"
NODE0 = "from-node-0"


def layer_sizes(size_bytes: int, blobs: int) -> list[int]:
    """``blobs`` layer sizes (uncompressed) adding up to ``size_bytes``, within one byte."""
    if blobs < 1 or size_bytes < blobs:
        raise ValueError(f"{blobs} blobs cannot share {size_bytes} bytes")
    base, extra = divmod(size_bytes, blobs)
    return [base + (1 if i < extra else 0) for i in range(blobs)]


def shape_problems(blob_sizes: Sequence[int], *, min_blobs: int = MIN_BLOBS) -> list[str]:
    """What keeps a bundle of these blob sizes from the issue's shape (none: it fits)."""
    total = sum(blob_sizes)
    problems = []
    if len(blob_sizes) < min_blobs:
        problems.append(f"{len(blob_sizes)} blobs, fewer than {min_blobs}")
    if blob_sizes and max(blob_sizes) * MAX_BLOB_SHARE > total:
        problems.append(f"the largest blob ({max(blob_sizes)} B) is over S/{MAX_BLOB_SHARE}")
    return problems


def link_bytes_per_s(rate_mbit: float) -> float:
    return rate_mbit * MB / 8


def growth(max_uploads: int, fetch_concurrency: int) -> float:
    """How many times the holders of a blob multiply per generation (k)."""
    return 1 + min(max_uploads, fetch_concurrency) / fetch_concurrency


def generations(nodes: int, k: float) -> int:
    """G(N): generations until ``nodes`` hold a blob that one held, holders times k each."""
    if nodes < 1 or k <= 1:
        raise ValueError(f"generations of {nodes} nodes growing {k} times")
    held, count = 1.0, 0
    while held < nodes:
        held *= k
        count += 1
    return count


# ---------------------------------------------------------------- measured values


@dataclass(frozen=True)
class NodeResult:
    """One node in one run; times in seconds since the stick was attached."""

    index: int
    first_byte_s: float | None
    complete_s: float | None
    bytes_held: int
    cpu_s: float
    sent_bytes: int
    received_bytes: int
    peak_rss_mib: float
    half_s: float | None = None
    """When the node held half of the bundle's bytes (runs saved before: None)."""
    ninety_s: float | None = None
    """When it held 90 %: ``complete_s - ninety_s`` is the tail of its fetch."""

    @property
    def rate_bytes_per_s(self) -> float | None:
        """Bytes held over the time from the first to the last byte (node 0: None)."""
        if self.index == 0 or self.first_byte_s is None or self.complete_s is None:
            return None
        span = self.complete_s - self.first_byte_s
        return self.bytes_held / span if span > 0 else None


@dataclass(frozen=True)
class Run:
    """One measurement: N nodes, one mode, the stick attached at time 0."""

    mode: str
    nodes: int
    stick_s: float
    t_all_s: float
    medium_read_bytes: int
    per_node: tuple[NodeResult, ...]
    crio_cpu_s: float
    machine_cpu_s: float
    steal_s: float
    corrupt_blobs: int
    partial_files: int
    integrity_events: int
    peer_drops: int
    """Peers the fetchers dropped (slow, failing or lying); informational."""
    idle_rss_mib: float
    """Largest idle RSS of the store-only daemons (serving and following), before the stick."""

    @property
    def reserved_share(self) -> float | None:
        """Of the bytes the nodes received, the share that nodes other than node 0 sent
        (re-served as they fetched); None when nothing was received."""
        received = sum(n.received_bytes for n in self.per_node)
        resent = sum(n.sent_bytes for n in self.per_node if n.index)
        return resent / received if received else None

    @property
    def notice_s(self) -> float | None:
        """From node 0 holding the bundle to the first peer's first byte."""
        firsts = [n.first_byte_s for n in self.per_node if n.index and n.first_byte_s is not None]
        return min(firsts) - self.stick_s if firsts else None


@dataclass(frozen=True)
class Workload:
    size_bytes: int
    """S: every blob of the bundle (what each node must hold)."""
    blob_count: int
    largest_blob_bytes: int
    rate_mbit: float
    max_uploads: int
    fetch_concurrency: int

    @property
    def ideal_transfer_s(self) -> float:
        """S / R at the nominal link rate."""
        return self.size_bytes / link_bytes_per_s(self.rate_mbit)


@dataclass(frozen=True)
class Calibration:
    rate_bytes_per_s: float
    """r: a node's download rate when its source keeps up (``_rate``)."""
    node0_rate_bytes_per_s: float
    """r0: node 0's upload rate when every node fetches from it alone."""
    stick_s: float
    notice_s: float
    generation_theory_s: float
    generation_fit_s: float | None
    """None: no fan-out run with N >= 3 to fit it from."""
    k: float

    @property
    def generation_s(self) -> float:
        return self.generation_theory_s if self.generation_fit_s is None else self.generation_fit_s


def _median(values: Sequence[float], what: str) -> float:
    if not values:
        raise ValueError(f"no measured {what} to calibrate from")
    return statistics.median(values)


def _rate(runs: Sequence[Run], node0_rate: float | None) -> float:
    """r: the fetching nodes' median rate in a 2-node fan-out (one sender, one receiver:
    the link's goodput with TLS and verification); without one, node 0's upload rate in
    the all-from-node-0 runs (the same link the other way); else the smallest fan-out's."""
    fanout = [r for r in runs if r.mode == FANOUT]
    smallest = min((r.nodes for r in fanout), default=0)
    if smallest != 2 and node0_rate is not None:
        return node0_rate
    rates = [
        x
        for r in fanout
        if r.nodes == smallest
        for n in r.per_node
        if (x := n.rate_bytes_per_s) is not None
    ]
    return _median(rates, "per-node rate")


def calibrate(runs: Sequence[Run], work: Workload) -> Calibration:
    fanout = [r for r in runs if r.mode == FANOUT]
    notices = [x for r in fanout if (x := r.notice_s) is not None]
    notice = _median(notices, "notice delay")
    base = [
        (r.nodes - 1) * work.size_bytes / (r.t_all_s - r.stick_s - notice)
        for r in runs
        if r.mode == NODE0 and r.t_all_s - r.stick_s - notice > 0
    ]
    node0_rate = statistics.median(base) if base else None
    rate = _rate(runs, node0_rate)
    stick = _median([r.stick_s for r in runs], "stick copy time")
    k = growth(work.max_uploads, work.fetch_concurrency)
    theory = work.fetch_concurrency * work.largest_blob_bytes / rate
    points = [
        (generations(r.nodes, k) - 1, r.t_all_s - r.stick_s - notice - work.size_bytes / rate)
        for r in fanout
    ]
    points = [(x, y) for x, y in points if x > 0]
    fit = None
    if points:
        fit = max(0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points))
    return Calibration(rate, node0_rate or rate, stick, notice, theory, fit, k)


def predict(cal: Calibration, nodes: int, work: Workload) -> dict[str, float]:
    """T_all and T_base (seconds) for ``nodes`` nodes, and T_all with the theoretical g."""
    start = cal.stick_s + cal.notice_s
    depth = generations(nodes, cal.k) - 1
    own = work.size_bytes / cal.rate_bytes_per_s
    return {
        "nodes": float(nodes),
        "generations": float(depth + 1),
        "t_all_s": start + own + depth * cal.generation_s,
        "t_all_theory_s": start + own + depth * cal.generation_theory_s,
        "t_base_s": start + (nodes - 1) * work.size_bytes / cal.node0_rate_bytes_per_s,
    }


def growth_seen(runs: Sequence[Run], cal: Calibration, work: Workload) -> str | None:
    """Which the largest fan-out run is closer to: the tree the model assumes, or node 0's
    link carrying every copy (new holders not used as sources); None without such a run."""
    fanout = [r for r in runs if r.mode == FANOUT and r.nodes >= 3]
    if not fanout:
        return None
    run = max(fanout, key=lambda r: r.nodes)
    tree = predict(cal, run.nodes, work)
    to_tree, to_node0 = (
        abs(run.t_all_s - tree["t_all_theory_s"]),
        abs(run.t_all_s - tree["t_base_s"]),
    )
    share = run.reserved_share or 0.0
    if to_tree <= to_node0:
        return f"N={run.nodes} grew as a tree (re-served {share:.0%}): the tree columns apply"
    return (
        f"N={run.nodes} grew as node 0's link carrying every copy (re-served {share:.0%}): "
        "read the 'all from node 0' column for this fetcher, not the tree's"
    )


def runs_from_json(doc: dict[str, Any]) -> tuple[list[Run], Workload]:
    """The runs and workload of a saved ``--json`` report (``dataclasses.asdict`` of them)."""
    runs = [
        Run(**{**r, "per_node": tuple(NodeResult(**n) for n in r["per_node"])}) for r in doc["runs"]
    ]
    return runs, Workload(**doc["workload"])


# ---------------------------------------------------------------- checks and the report


def _check(name: str, value: float | None, target: float | None) -> dict[str, Any]:
    result = None if target is None or value is None else ("PASS" if value <= target else "MISS")
    return {"name": name, "value": value, "target_max": target, "result": result}


def find_run(runs: Sequence[Run], mode: str, nodes: int) -> Run | None:
    """The run of ``mode`` with ``nodes`` nodes; a fan-out of 2 nodes is its own baseline
    (node 1's only peer is node 0 either way), so it stands for the baseline too."""
    found = [r for r in runs if r.mode == mode and r.nodes == nodes]
    if not found and mode == NODE0 and nodes == 2:
        found = [r for r in runs if r.mode == FANOUT and r.nodes == 2]
    return found[0] if found else None


def summarize(runs: Sequence[Run], work: Workload) -> dict[str, Any]:
    largest = max(r.nodes for r in runs)
    top = find_run(runs, FANOUT, largest)
    base = find_run(runs, NODE0, largest)
    over_ideal = None if top is None else (top.t_all_s - top.stick_s) / work.ideal_transfer_s
    vs_base = None if top is None or base is None else top.t_all_s / base.t_all_s
    read_ratio = max(r.medium_read_bytes / work.size_bytes for r in runs)
    checks = [
        _check(f"(T_all - stick) / (S/R), N={largest}", over_ideal, 1.5),
        _check(f"T_all / all-from-node-0, N={largest}", vs_base, 0.3),
        _check("medium bytes read / S (worst run)", read_ratio, 1.01),
        _check("blobs failing their digest, all stores", sum(r.corrupt_blobs for r in runs), 0),
        _check("partial files left, all stores", sum(r.partial_files for r in runs), 0),
        _check("integrity events in the logs", sum(r.integrity_events for r in runs), 0),
        _check("idle RSS MiB, serving on", max(r.idle_rss_mib for r in runs), RSS_BUDGET_MIB),
    ]
    cal = calibrate(runs, work)
    sizes = sorted({r.nodes for r in runs} | set(SCALE_NODES))
    model = [predict(cal, n, work) for n in sizes]
    return {
        "checks": checks,
        "calibration": cal,
        "model": model,
        "growth": growth_seen(runs, cal, work),
    }


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def render_runs(runs: Sequence[Run], work: Workload) -> list[str]:
    lines = [
        f"{'run':18} {'T_all s':>8} {'stick s':>8} {'ideal s':>8} {'T/ideal':>8} "
        f"{'notice s':>8} {'re-served':>9} {'read/S':>7} {'daemons CPU s':>13} "
        f"{'machine CPU s':>13} {'drops':>5}",
    ]
    for r in sorted(runs, key=lambda r: (r.nodes, r.mode)):
        ideal = r.stick_s + work.ideal_transfer_s
        cpu = sum(n.cpu_s for n in r.per_node)
        lines.append(
            f"{r.mode + f' N={r.nodes}':18} {r.t_all_s:8.1f} {r.stick_s:8.1f} {ideal:8.1f} "
            f"{r.t_all_s / ideal:8.2f} {_fmt(r.notice_s, '.1f'):>8} "
            f"{_fmt(None if r.reserved_share is None else 100 * r.reserved_share, '.0f'):>8}% "
            f"{r.medium_read_bytes / work.size_bytes:7.3f} {cpu:13.1f} {r.machine_cpu_s:13.1f}"
            f" {r.peer_drops:5d}"
        )
    return lines


def render_nodes(run: Run) -> list[str]:
    lines = [
        f"{run.mode} N={run.nodes}: node  first byte s  half s  90% s  complete s  MB/s"
        f"  sent MB  recv MB  CPU s  peak RSS MiB",
    ]
    for n in run.per_node:
        rate = n.rate_bytes_per_s
        mb_per_s = None if rate is None else rate / MB
        lines.append(
            f"{'':22}{n.index:4}  {_fmt(n.first_byte_s, '.1f'):>12}  "
            f"{_fmt(n.half_s, '.1f'):>6}  {_fmt(n.ninety_s, '.1f'):>5}  "
            f"{_fmt(n.complete_s, '.1f'):>10}  {_fmt(mb_per_s, '.1f'):>4}"
            f"  {n.sent_bytes / MB:7.0f}  {n.received_bytes / MB:7.0f}  {n.cpu_s:5.1f}"
            f"  {n.peak_rss_mib:12.1f}"
        )
    lines.append(f"{'':22}CRI-O (node 0) CPU s {run.crio_cpu_s:.1f}, steal s {run.steal_s:.1f}")
    return lines


def render_model(summary: dict[str, Any], work: Workload) -> list[str]:
    cal: Calibration = summary["calibration"]
    fit = (
        "none (no fan-out run with N >= 3)"
        if cal.generation_fit_s is None
        else (f"{cal.generation_fit_s:.1f} s")
    )
    lines = [
        f"model: T_all = T_stick + d + S/r + (G(N) - 1) * g; G(N) = ceil(log_k N), k = {cal.k:g}",
        f"  calibrated: r = {cal.rate_bytes_per_s / MB:.1f} MB/s per node "
        f"(link {link_bytes_per_s(work.rate_mbit) / MB:.1f}), r0 = "
        f"{cal.node0_rate_bytes_per_s / MB:.1f} MB/s, T_stick = {cal.stick_s:.1f} s, "
        f"d = {cal.notice_s:.1f} s, g = {fit} (theory F*c/r = {cal.generation_theory_s:.1f} s)",
        f"{'nodes':>7} {'G(N)':>5} {'tree, g fitted s':>17} {'tree, g = F*c/r s':>18} "
        f"{'all from node 0 s':>18}",
    ]
    for p in summary["model"]:
        lines.append(
            f"{p['nodes']:7.0f} {p['generations']:5.0f} {p['t_all_s']:17.1f} "
            f"{p['t_all_theory_s']:18.1f} {p['t_base_s']:18.1f}"
        )
    if summary.get("growth"):
        lines.append(f"  measured: {summary['growth']}")
    return lines


def render_checks(summary: dict[str, Any]) -> list[str]:
    lines = [f"{'check':44} {'value':>8} {'target':>8}  result"]
    for c in summary["checks"]:
        target = "-" if c["target_max"] is None else f"<= {c['target_max']:g}"
        lines.append(f"{c['name']:44} {_fmt(c['value']):>8} {target:>8}  {c['result'] or '-'}")
    return lines


def render_report(runs: Sequence[Run], work: Workload, header: Sequence[str]) -> str:
    summary = summarize(runs, work)
    lines = [*header, "", *render_runs(runs, work), ""]
    for run in sorted(runs, key=lambda r: (r.nodes, r.mode)):
        lines += [*render_nodes(run), ""]
    lines += [*render_model(summary, work), "", *render_checks(summary)]
    return "\n".join(lines)


def gb(size_bytes: float) -> str:
    return f"{size_bytes / GB:.3f} GB"


def median_or_nan(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan
