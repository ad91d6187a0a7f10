"""Restore benchmark: pinned images back from the node's image store after a CRI-O wipe.

The bundle of ``bench.bundle_import`` (default 8 images x one layer of random data, 2.0 GB;
``--size-gb`` to change it) on a read-only ext4 loop device. Each round, in this order,
with a cold page cache (``sync; echo 3 > /proc/sys/vm/drop_caches``) before each
measurement, on one fresh CRI-O and one fresh nodeagent state directory per round::

    .venv/bin/python -m bench.restore [--size-gb 2] [--quick] [--repeat 3] [--json]

* ``import`` (baseline i): ``nodeagent bundle import MNT`` (what ``bench.bundle_import``
  times): signature and tree check, the stick-to-store copy, the import from the store
  through CRI-O and the sync that pins the set; process start to exit 0. It fills the
  node's image store the next two measurements read.
* ``restore``: what a power cut leaves: CRI-O SIGKILLed, its storage and run directory
  deleted; ``nodeagent run`` started first (as the units start: READY=1 before CRI-O);
  then CRI-O started, and the time from that start until CRI says every image of the set
  is stored and pinned (polled every 0.1 s). Also shown from CRI-O answering (info).
* ``skopeo`` (baseline ii): CRI-O stopped and its storage deleted again; ``skopeo copy
  oci:STORE:REF containers-storage:REF`` for every image, one after another, with CRI-O's
  own ``storage.conf`` (the same vfs store CRI-O and the restore write).

Goals (issue 14): restore <= 1.0 x import; restore <= 1.1 x skopeo.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.bundle_import import (
    GB,
    MB,
    SET_NAME,
    Media,
    children_cpu_s,
    drop_caches,
    ext4_media,
    machine,
    machine_cpu_s,
    machine_spent,
    make_bundle,
    nodeagent_cmd,
    run_as_root,
    run_stamped,
    runtime_version,
    skopeo_copies,
    skopeo_policy,
)
from bench.prepull import cpu_s, progress
from nodeagent.adapters.cri.client import CriClient
from nodeagent.bundles import minisign
from nodeagent.logs import event_of
from tests.faults.node import NotifyListener
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio, _unmount_below
from tests.testenv.waiting import wait_for

MEASUREMENTS = ("import", "restore", "skopeo")
LABELS = {
    "import": "nodeagent bundle import -> exit 0 (i)",
    "import_only": "  of it: to bundle_imported",
    "restore": "restore: CRI-O start -> all pinned",
    "restore_after_socket": "  of it: CRI-O answering -> all pinned",
    "skopeo": "skopeo copy oci:STORE, each image (ii)",
}
POLL_S = 0.1


class BenchError(RuntimeError):
    """A measured step failed or did not leave what it should have."""


@dataclass
class Measure:
    name: str
    wall_s: float
    cpu_s: dict[str, float]
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Node:
    """One round's CRI-O and nodeagent (its store under the state directory)."""

    crio: Crio
    agent: Agent
    notify: NotifyListener

    @property
    def store(self) -> Path:
        return self.agent.state_dir / "store"


def make_node(base: Path, public: str, *, is_started: bool = True) -> Node:
    """A node trusting ``public``; its CRI-O started unless ``is_started`` is False."""
    crio = Crio(base / "crio")
    if is_started:
        crio.start()
    agent = Agent(base / "agent", crio)
    notify = NotifyListener(base / "notify.sock")
    agent.extra_env["NOTIFY_SOCKET"] = str(notify.path)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (agent.trusted_keys_dir / "bench.pub").write_text(public)
    return Node(crio, agent, notify)


def close_node(node: Node) -> None:
    if node.agent.process is not None:
        node.agent.stop()
    node.notify.close()
    node.crio.cleanup()


def wipe_runtime(crio: Crio, *, is_killed: bool) -> None:
    """CRI-O gone (SIGKILL, or stopped), its storage and run directory deleted."""
    if is_killed:
        crio.kill()
    else:
        crio.stop()
    _unmount_below(crio.base / "run")
    shutil.rmtree(crio.storage_root, ignore_errors=True)
    shutil.rmtree(crio.base / "run", ignore_errors=True)
    (crio.base / "run").mkdir()


# ------------------------------------------------------------------ measurements


def measure_import(node: Node, media: Media) -> Measure:
    crio, agent = node.crio, node.agent
    assert crio.process is not None
    cmd = nodeagent_cmd(agent.config_file, "bundle", "import", str(media.mountpoint), "--json")
    drop_caches()
    crio_before, cpu_before = cpu_s(crio.process.pid), children_cpu_s()
    busy_before, started = machine_cpu_s(), time.monotonic()
    code, _stdout, lines = run_stamped(cmd, agent.env())
    ended = time.monotonic()
    cpu = {
        "nodeagent": children_cpu_s() - cpu_before,
        "crio": cpu_s(crio.process.pid) - crio_before,
    }
    cpu |= machine_spent(busy_before)
    if code != 0:
        tail = "\n".join(line for _, line in lines[-30:])
        raise BenchError(f"bundle import exited {code}:\n{tail}")
    if set_state(agent.status() or {}, SET_NAME) != "Pinned":
        raise BenchError(f"set {SET_NAME} not Pinned after the import: {agent.status()}")
    extra = {}
    imported = next((t for t, line in lines if event_of(line) == "bundle_imported"), None)
    stored = next((t for t, line in lines if event_of(line) == "bundle_stored"), None)
    if imported is not None:
        extra["import_only_s"] = imported - started
    if stored is not None:
        extra["start -> medium may be removed s"] = stored - started
    return Measure("import", ended - started, cpu, extra)


async def wait_all_pinned(endpoint: str, refs: list[str], *, timeout_s: float) -> float:
    """The monotonic time CRI first reported every one of ``refs`` stored and pinned."""
    deadline = time.monotonic() + timeout_s
    async with CriClient(endpoint, timeout_s=60) as cri:
        while True:
            found = [await cri.image_status(ref) for ref in refs]
            if all(image is not None and image.is_pinned for image in found):
                return time.monotonic()
            if time.monotonic() > deadline:
                raise BenchError(f"not all pinned after {timeout_s:.0f} s: {found}")
            await asyncio.sleep(POLL_S)


def measure_restore(node: Node, refs: list[str]) -> Measure:
    crio, agent = node.crio, node.agent
    wipe_runtime(crio, is_killed=True)
    since = node.notify.count()
    agent.start()
    node.notify.wait_ready(since=since)
    drop_caches()
    busy_before = machine_cpu_s()
    assert agent.process is not None
    agent_before = cpu_s(agent.process.pid)
    started = time.monotonic()
    crio.start()
    answering = time.monotonic()
    assert crio.process is not None
    back = asyncio.run(wait_all_pinned(crio.endpoint, refs, timeout_s=600))
    cpu = {"nodeagent": cpu_s(agent.process.pid) - agent_before}
    cpu["crio"] = cpu_s(crio.process.pid)  # a fresh process: all of its CPU time
    cpu |= machine_spent(busy_before)
    # The journal line comes when the restore's mirror session ended (after "all pinned").
    wait_for(
        lambda: "images_restored_from_store" in agent.current_run_log(),
        timeout_s=120,
        what="the restore's journal line",
    )
    log = agent.current_run_log()
    if f"restored {len(refs)} images from the local store" not in log:
        raise BenchError(f"the images did not come from the store:\n{log[-3000:]}")
    agent.stop()
    extra = {
        "restore_after_socket_s": back - answering,
        "CRI-O start to answering s": answering - started,
    }
    return Measure("restore", back - started, cpu, extra)


def measure_skopeo(node: Node, refs: list[str]) -> Measure:
    crio = node.crio
    wipe_runtime(crio, is_killed=False)
    policy = skopeo_policy(crio.base)
    env = dict(os.environ, CONTAINERS_STORAGE_CONF=str(crio.storage_conf))
    drop_caches()
    busy_before, cpu_before, started = machine_cpu_s(), children_cpu_s(), time.monotonic()
    skopeo_copies([(f"oci:{node.store}:{ref}", f"containers-storage:{ref}") for ref in refs],
                  policy, env)  # fmt: skip
    wall_s = time.monotonic() - started
    cpu = {"skopeo": children_cpu_s() - cpu_before} | machine_spent(busy_before)
    stored = json.loads((crio.storage_root / "vfs-images" / "images.json").read_text())
    if len(stored) != len(refs):
        raise BenchError(f"skopeo stored {len(stored)} of {len(refs)} images")
    return Measure("skopeo", wall_s, cpu)


def measure_round(base: Path, media: Media, public: str) -> list[Measure]:
    node = make_node(base, public)
    try:
        found = []
        for name in MEASUREMENTS:
            progress(f"  {name}")
            if name == "import":
                result = measure_import(node, media)
            elif name == "restore":
                result = measure_restore(node, media.refs)
            else:
                result = measure_skopeo(node, media.refs)
            progress(f"  {result.wall_s:.2f} s")
            found.append(result)
        return found
    finally:
        close_node(node)
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------ report


def summarize(runs: dict[str, list[Measure]], size_bytes: int) -> dict[str, Any]:
    wall = {name: statistics.median(m.wall_s for m in ms) for name, ms in runs.items()}
    wall["import_only"] = statistics.median(
        m.extra.get("import_only_s", float("nan")) for m in runs["import"]
    )
    wall["restore_after_socket"] = statistics.median(
        m.extra["restore_after_socket_s"] for m in runs["restore"]
    )
    checks = [
        ("restore/import", wall["restore"] / wall["import"], 1.0),
        ("restore/skopeo", wall["restore"] / wall["skopeo"], 1.1),
        ("restore/import to bundle_imported (info)", wall["restore"] / wall["import_only"], None),
        (
            "restore from CRI-O answering/skopeo (info)",
            wall["restore_after_socket"] / wall["skopeo"],
            None,
        ),
    ]
    return {
        "wall_s": wall,
        "mb_per_s": {name: size_bytes / MB / s for name, s in wall.items()},
        "checks": [
            {
                "name": name,
                "value": value,
                "target_max": target,
                "result": None if target is None else ("PASS" if value <= target else "MISS"),
            }
            for name, value, target in checks
        ],
    }


def render_table(report: dict[str, Any]) -> str:
    m, w, summary = report["machine"], report["workload"], report["summary"]
    runs: dict[str, list[Measure]] = report["runs"]
    lines = [
        f"workload: {w['images']} images x 1 layer of {w['layer_mb']:.0f} MB random data "
        f"(gzip -1), bundle {w['bundle_bytes'] / GB:.3f} GB, read-only ext4 on {w['devnode']}, "
        f"median of {w['repeat']}",
        f"machine: {m['nproc']} CPUs, {m['mem_gib']:.1f} GiB, Linux {m['kernel']}, "
        f"{m['runtime']}, {m['skopeo']}, Python {m['python']}",
        "cold page cache before each measurement; store and CRI-O storage share a filesystem",
        "",
        f"{'measurement':40} {'wall s':>8} {'MB/s':>7}  CPU s",
    ]
    for name in ("import", "import_only", "restore", "restore_after_socket", "skopeo"):
        source = runs.get(name, [])
        cpu = ", ".join(
            f"{k} {statistics.median(x.cpu_s[k] for x in source):.1f}"
            for k in (source[0].cpu_s if source else {})
        )
        lines.append(
            f"{LABELS[name]:40} {summary['wall_s'][name]:8.2f} "
            f"{summary['mb_per_s'][name]:7.0f}  {cpu}"
        )
    for name in ("import", "restore"):
        keys = [k for k in runs[name][0].extra if not k.endswith("_s")]
        lines += [
            f"{name}: {k} {statistics.median(x.extra[k] for x in runs[name]):.2f}" for k in keys
        ]
    lines += ["", f"{'check':44} {'value':>7} {'target':>8}  result"]
    for c in summary["checks"]:
        target = "-" if c["target_max"] is None else f"<= {c['target_max']:g}"
        lines.append(f"{c['name']:44} {c['value']:7.2f} {target:>8}  {c['result'] or '-'}")
    return "\n".join(lines)


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.restore", description=__doc__.split("\n")[0])
    p.add_argument("--size-gb", type=float, default=2.0, help="bundle size, GB (default 2.0)")
    p.add_argument("--quick", action="store_true", help="a 0.3 GB bundle instead of --size-gb")
    p.add_argument("--images", type=int, default=8, help="images, one layer each (default 8)")
    p.add_argument("--repeat", type=int, default=1, help="rounds of every measurement; median")
    p.add_argument("--seed", type=int, default=4242, help="layer content seed (4242)")
    p.add_argument("--workdir", type=Path, help="parent of the temp dir (default: $TMPDIR)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.size_gb = 0.3
    return opts


def bench(base: Path, opts: argparse.Namespace) -> dict[str, Any]:
    public, secret = minisign.generate_keypair(comment="nodeagent bench restore")
    bundle_dir = make_bundle(base, opts, public, secret)
    runs: dict[str, list[Measure]] = {name: [] for name in MEASUREMENTS}
    with ext4_media(bundle_dir, base) as media:
        for round_no in range(1, opts.repeat + 1):
            progress(f"round {round_no}/{opts.repeat}")
            for result in measure_round(base / f"round-{round_no}", media, public):
                runs[result.name].append(result)
        workload = {
            "images": opts.images,
            "layer_mb": opts.size_gb * GB / opts.images / MB,
            "bundle_bytes": media.size_bytes,
            "devnode": media.devnode,
            "repeat": opts.repeat,
            "seed": opts.seed,
        }
    with Crio(base / "crio-version") as crio:
        runtime = asyncio.run(runtime_version(crio.endpoint))
    return {
        "machine": machine(runtime),
        "workload": workload,
        "runs": runs,
        "summary": summarize(runs, workload["bundle_bytes"]),
    }


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    return run_as_root("bench.restore", "nodeagent-bench-restore-", opts, bench, render_table)


if __name__ == "__main__":
    sys.exit(main())
