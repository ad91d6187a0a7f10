"""The report of ``bench.release_scale``: fits per step, the goals table (issue 31), the text.

``summarize`` takes the sizes' results (plain dicts, as ``--json`` prints them) and returns:

* ``fits``: per step and figure (nodeagent's seconds, the baseline's seconds, nodeagent's
  peak RSS, the disk at the peak), the least-squares line against the size in GiB, its
  value at 16 GiB, and how far a pure per-GiB cost is from explaining the smaller size;
* ``goals``: each goal of issue 31 as a value, its limit and PASS/MISS, at the largest
  size measured and extrapolated to 16 GiB (a ratio of two fitted lines).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from bench.scale_measure import GIB, MIB, Fit, fit

FULL_GIB = 16.0
RSS_LIMIT_MIB = 256.0
"""The unit's MemoryHigh (issue 31)."""
NODEAGENT_ROLES = ("nodeagent", "bench.scale_steps")


def nodeagent_rss(side: dict[str, Any]) -> float:
    found = [v for k, v in side["rss_mib"].items() if k.startswith(NODEAGENT_ROLES)]
    return max(found, default=0.0)


def figures(step: dict[str, Any]) -> dict[str, float]:
    """The figures of one step that are fitted against the size."""
    out = {
        "seconds": step["nodeagent"]["seconds"],
        "nodeagent_rss_mib": nodeagent_rss(step["nodeagent"]),
        "disk_mib": step["nodeagent"]["disk_bytes"] / MIB,
    }
    if step["baseline"] is not None:
        out["baseline_seconds"] = step["baseline"]["seconds"]
        out["baseline_disk_mib"] = step["baseline"]["disk_bytes"] / MIB
    return out


def by_step(sizes: list[dict[str, Any]]) -> dict[str, list[tuple[float, dict[str, Any]]]]:
    found: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for size in sizes:
        gib = size["bundle_bytes"] / GIB  # the bytes measured, not the bytes asked for
        for step in size["steps"]:
            found.setdefault(step["name"], []).append((gib, step))
    return found


def fits(sizes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        name: {k: asdict(v) if v else None for k, v in fits_of(points).items()}
        for name, points in by_step(sizes).items()
    }


def _ratio_goal(
    rows: list[dict[str, Any]], name: str, step: str, found: dict[str, Any], limit: float
) -> None:
    points = found.get(step)
    if not points or points[-1][1]["baseline"] is None:
        return
    largest = figures(points[-1][1])
    measured = largest["seconds"] / largest["baseline_seconds"]
    lines = fits_of(points)
    extrapolated = None
    ours, theirs = usable(lines.get("seconds")), usable(lines.get("baseline_seconds"))
    if ours is not None and theirs is not None:
        extrapolated = ours.at_full / theirs.at_full
    rows.append(goal_row(name, measured, extrapolated, limit))


def usable(line: Fit | None) -> Fit | None:
    """A line to extrapolate with: not falling with the size (a smaller size that ran
    slower is the machine's noise, not a saving) and positive at 16 GiB."""
    return line if line is not None and line.slope_per_gib >= 0 and line.at_full > 0 else None


def fits_of(points: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    keys = figures(points[0][1])
    return {k: fit([(g, figures(s)[k]) for g, s in points], FULL_GIB) for k in keys}


def goal_row(name: str, measured: float, at_full: float | None, limit: float) -> dict[str, Any]:
    def verdict(value: float | None) -> str | None:
        if value is None or limit == float("inf"):  # no value, or a figure for information
            return None
        return "PASS" if value <= limit else "MISS"

    return {
        "goal": name,
        "limit": limit,
        "measured": measured,
        "measured_result": verdict(measured),
        "at_16gib": at_full,
        "at_16gib_result": verdict(at_full),
    }


def goals(sizes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = by_step(sizes)
    rows: list[dict[str, Any]] = []
    _ratio_goal(rows, "import / skopeo (N at once)", "import", found, 1.1)
    _ratio_goal(rows, "restore / skopeo (N at once)", "restore", found, 1.1)
    _ratio_goal(rows, "stick copy / raw read", "copy", found, 1.1)
    _ratio_goal(rows, "store verify / openssl", "verify", found, 1.1)
    _ratio_goal(rows, "bundle create / skopeo to oci: (info)", "create", found, float("inf"))
    rows += _copy_goals(found) + _once_goals(found) + _rss_goals(found) + _disk_goals(found)
    return rows


Found = dict[str, list[tuple[float, dict[str, Any]]]]


def _copy_goals(found: Found) -> list[dict[str, Any]]:
    if not found.get("copy"):
        return []
    copied = found["copy"][-1][1]["extra"]
    device = copied["device_bytes_over_bundle"]
    rows = [goal_row("stick copy: medium bytes read / bundle", device, None, 1.01)]
    if "throttled_copy_over_read" in copied:
        rows.append(goal_row(
            f"stick copy / raw read, both at {copied['throttled_mbps']:g} MB/s",
            copied["throttled_copy_over_read"], None, 1.1,
        ))  # fmt: skip
    return rows


def _once_goals(found: Found) -> list[dict[str, Any]]:
    """The fan-outs and the pre-pull: measured at one size, nothing to fit."""
    rows: list[dict[str, Any]] = []
    for _size, step in found.get("fanout", []):
        doc = step["extra"]["figures"]
        judged = doc["ratio_verdict"] is not None
        rows.append(goal_row(
            f"fan-out, {doc['nodes']} nodes at {doc['rate_mbit']:g} Mbit/s: T_all / (S/R)",
            doc["ratio"], None, doc["ratio_goal"] if judged else float("inf"),
        ))  # fmt: skip
        rows.append(goal_row(f"fan-out, {doc['nodes']} nodes: a daemon's peak RSS MiB",
                             doc["peak_rss_mib"], None, doc["rss_goal_mib"]))  # fmt: skip
    for _size, step in found.get("prepull", []):
        doc = step["extra"]["figures"]
        rows.append(goal_row("pre-pull over the 50 ms link: nodeagent / CPU floor",
                             doc["over_floor"], None, 2.0))  # fmt: skip
        rows.append(goal_row("pre-pull over the 50 ms link: nodeagent / serial",
                             doc["over_serial"], None, 0.15))  # fmt: skip
    return rows


def _rss_goals(found: Found) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, points in found.items():
        if name in {"fanout", "prepull"}:
            continue
        lines = fits_of(points)
        rss = usable(lines.get("nodeagent_rss_mib"))
        measured = figures(points[-1][1])["nodeagent_rss_mib"]
        at_full = rss.at_full if rss else None
        rows.append(goal_row(f"{name}: nodeagent peak RSS MiB", measured, at_full, RSS_LIMIT_MIB))
    return rows


def _disk_goals(found: Found) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in ("import", "restore"):
        if not found.get(name):
            continue
        step = found[name][-1][1]
        imported = found["import"][-1][1]["extra"] if found.get("import") else step["extra"]
        floor = imported.get("store_bytes", 0) + step["extra"]["unpacked_bytes"]
        ratio = step["nodeagent"]["disk_bytes"] / floor if floor else float("nan")
        rows.append(goal_row(f"{name}: disk at the peak / (store + unpacked)", ratio, None, 1.05))
    if found.get("refused"):
        left = found["refused"][-1][1]["extra"]
        remaining = left["store_bytes_left"] + left["crio_storage_bytes_left"]
        rows.append(goal_row("refused import: bytes left in store + CRI-O", remaining, None, 0))
        if "store_bytes_after_gc_grace" in left:
            after = left["store_bytes_after_gc_grace"] + left["crio_storage_bytes_left"]
            rows.append(goal_row("  the same after the keeper's gc_grace_s", after, None, 0))
    return rows


def summarize(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"fits": fits(sizes), "goals": goals(sizes)}


def _num(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def render(report: dict[str, Any]) -> str:
    lines: list[str] = []
    for size in report["sizes"]:
        r = size["release"]
        lines += [
            f"== {size['size_gib']:g} GiB asked, bundle {size['bundle_bytes'] / GIB:.3f} GiB: "
            f"{r['images']} images ({'+'.join(r['architectures'])} in each index, "
            f"{r['measured_architecture']} measured), {r['unique_layers']} layers "
            f"(p10/p50/p90/max MB: "
            + "/".join(f"{v / 1e6:.1f}" for v in r["layer_bytes_p10_p50_p90_max"])
            + f"), setup {size['setup'].get('generate_and_push_s', 0):.0f} s",
            f"{'step':9} {'side':58} {'s':>8} {'disk MiB':>9}  peak RSS MiB",
        ]
        for step in size["steps"]:
            for side in (step["nodeagent"], step["baseline"]):
                if side is None:
                    continue
                rss = ", ".join(f"{k} {v:.0f}" for k, v in side["rss_mib"].items()
                                if k.startswith((*NODEAGENT_ROLES, "skopeo", "crio")))  # fmt: skip
                lines.append(f"{step['name']:9} {side['what'][:58]:58} {side['seconds']:8.2f} "
                             f"{side['disk_bytes'] / MIB:9.0f}  {rss}")  # fmt: skip
            extra = {k: v for k, v in step["extra"].items() if not isinstance(v, dict | list)}
            shown = (
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in extra.items()
            )
            lines.append("          " + ", ".join(shown))
    lines += ["", f"fits against the size (GiB), extrapolated to {FULL_GIB:g} GiB:",
              f"{'step':9} {'figure':20} {'per GiB':>10} {'intercept':>10} {'16 GiB':>10} "
              f"{'prop. miss':>10}"]  # fmt: skip
    for name, figs in report["summary"]["fits"].items():
        for key, line in figs.items():
            if line is None:
                continue
            lines.append(f"{name:9} {key:20} {line['slope_per_gib']:10.2f} "
                         f"{line['intercept']:10.2f} {line['at_full']:10.2f} "
                         f"{_num(line['proportional_miss'])!s:>10}")  # fmt: skip
    lines += ["", f"{'goal':52} {'limit':>7} {'measured':>9} {'':5} {'16 GiB':>9}"]
    for row in report["summary"]["goals"]:
        limit = "-" if row["limit"] == float("inf") else f"{row['limit']:g}"
        lines.append(f"{row['goal'][:52]:52} {limit:>7} {row['measured']:9.3f} "
                     f"{row['measured_result'] or '':5} {_num(row['at_16gib'], '9.3f'):>9} "
                     f"{row['at_16gib_result'] or ''}")  # fmt: skip
    lines.append(f"whole run {report['wall_s']:.0f} s, load average "
                 + " ".join(f"{v:.1f}" for v in report["load_average"]))  # fmt: skip
    return "\n".join(lines)
