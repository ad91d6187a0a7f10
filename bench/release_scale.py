"""Release scale (issue 31): a real-size OpenShift release end to end, every step against its floor.

A synthetic release (``bench/scale_release.py``: ``IMAGES`` multi-arch payload images, a
realistic size spread, shared base layers; cached under ~/.cache/nodeagent-testenv/) is
pushed into a loopback registry at each size; then, each next to its baseline in the same
run, cold page cache, every byte written on a scratch filesystem of its own
(``bench/scale_steps.py``, ``bench/scale_measure.py``)::

    create   bundle create --release            vs skopeo copy docker:// -> oci:, same arch
    refused  a tampered copy imported: refused, nothing left behind (no baseline)
    copy     stick -> store copy (copy_bundle)  vs a raw read of the medium
    verify   nodeagent store verify             vs openssl dgst -sha256, same blobs
    import   bundle import -> exit 0 (pinned)   vs skopeo copy -> containers-storage, N at once
    restore  after a wipe, CRI-O start -> pinned vs the same skopeo
    fanout   bench.scale_fanout.fanout_step: 4 and 8 nodes at 100 Mbit/s, at one size
             (--fanout-gb, --fanout-nodes)  vs S/R
    prepull  bench/prepull.py's link profile, once: the daemon over a 50 ms round trip
             vs serial CRI pulls and the CPU floor

Each at ``--size-gb`` (GiB of compressed blobs, one architecture) and at a second, smaller
size; per-GiB slopes and intercepts are fitted and extrapolated to 16 GiB. Run as root::

    python -m bench.release_scale [--size-gb 6] [--second-gb 2] [--steps ...] [--json]
    python -m bench.release_scale --quick          # 2 GiB alone, no fan-out or pre-pull
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.bundle_import import ext4_media, run_as_root
from bench.prepull import progress
from bench.scale_measure import GIB, scratch_fs, used_bytes
from bench.scale_release import CACHE, ImagePlan, describe, plan_release, push_scaled_release
from bench.scale_report import render, summarize
from bench.scale_steps import Context, Step, node_steps, step_create, step_refused
from nodeagent import logs
from nodeagent.bundles import minisign
from tests.testenv.registry import Registry
from tests.testenv.release import TestGpg, signature_document, write_signature_store

STEPS = ("create", "refused", "copy", "verify", "import", "restore", "fanout", "prepull")
WORKDIR = Path("/var/tmp")  # noqa: S108 - a disk, not tmpfs; the run's directory is private
GOAL_RATE_MBIT = 100
"""The fan-out goal's link rate (issue 31)."""
STICK_MBPS = 100.0
"""A USB 3 stick's sequential read (the copy is also measured held to it: ``--throttle-mbps``)."""
QUICK_STEPS = ("create", "refused", "copy", "verify", "import", "restore")
"""``--quick``'s steps: every one but the fan-out (which alone would take it past 8
minutes) and the pre-pull over a far link (the same at every size)."""


def fanout(
    ctx: Context,
    stick_image: Path,
    bundle_bytes: int,
    work: Path,
    *,
    nodes: int = 4,
    rate_mbit: int = GOAL_RATE_MBIT,
) -> Step | None:
    """THE FAN-OUT CALL SITE. ``bench.scale_fanout.fanout_step`` (written apart, issue 31's
    fan-out to 4 nodes at 100 Mbit/s) gets the stick image (an ext4 image file holding the
    bundle at its root; meanwhile attached read-only and mounted ``ro,noload`` here, which
    writes nothing to it), relabelled ``NODEAGENT1`` so that node 0's udevd takes it for a
    stick, the bundle's bytes, a work directory and the trusted public key, and returns a
    dict of figures, kept as they are in the report. None when that module is absent."""
    try:
        module = importlib.import_module("bench.scale_fanout")
    except ImportError:
        progress("fanout: bench.scale_fanout is not in this tree; step skipped")
        return None
    from bench.scale_steps import Side  # noqa: PLC0415
    from tests.testenv.bundles import LABEL as STICK_LABEL  # noqa: PLC0415

    subprocess.run(["e2label", str(stick_image), STICK_LABEL], check=True, capture_output=True)
    started = time.monotonic()
    figures: dict[str, Any] = module.fanout_step(
        stick_image, bundle_bytes, nodes=nodes, rate_mbit=rate_mbit, workdir=work,
        public_key=ctx.public_key,
    )  # fmt: skip
    what = f"fan-out to {nodes} nodes at {rate_mbit} Mbit/s"
    side = Side(what, time.monotonic() - started, {}, 0)
    return Step("fanout", side, None, {"figures": figures})


def prepull(work: Path) -> Step:
    """``bench/prepull.py``'s link profile (its 50 images behind a 50 ms round trip, a fresh
    CRI-O each): the daemon from its start to Pinned against serial CRI pulls, and against
    the CPU floor (serial's CRI-O, registry and link CPU spread over every CPU), the same
    figures as that benchmark's. Issue 31: at most 2.0 x the floor and 0.15 x serial."""
    from bench import prepull as bench_prepull  # noqa: PLC0415 - only this step needs it
    from bench.scale_steps import Side  # noqa: PLC0415

    opts = bench_prepull.parse_args(["--profiles", "link", "--strategies", "serial,nodeagent"])
    report = bench_prepull.bench(work / "prepull", opts)
    summary = report["summary"]["link"]
    wall, floor = summary["wall_s"], summary["cpu_floor_s"]
    figures = {
        "link": report["workload"]["link"], "images": report["workload"]["images"],
        "nodeagent_s": wall["nodeagent"], "serial_s": wall["serial"], "cpu_floor_s": floor,
        "over_floor": wall["nodeagent"] / floor, "over_serial": wall["nodeagent"] / wall["serial"],
        "nodeagent": summary["nodeagent"],
        "runs": {strategy: {"cpu_s": run.cpu_s, "crio_pull_mean_s": run.crio_pull_mean_s,
                            "wall_s": run.wall_s}
                 for strategy, (run, *_) in report["runs"]["link"].items()},
    }  # fmt: skip
    side = Side("nodeagent: daemon start -> Pinned over the link", wall["nodeagent"], {}, 0)
    base = Side("serial CRI pulls over the link", wall["serial"], {}, 0)
    return Step("prepull", side, base, {"figures": figures})


def platforms(registry_url: str, ref: str) -> list[str]:
    """The architectures the registry's index of ``ref`` (by digest) lists."""
    repository, digest = ref.split("/", 1)[1].split("@")
    url = f"{registry_url}/v2/{repository}/manifests/{digest}"
    accept = {"Accept": "application/vnd.oci.image.index.v1+json"}
    request = urllib.request.Request(url, headers=accept)  # noqa: S310 - the loopback registry
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - loopback
        index = json.loads(answer.read())
    return sorted(m["platform"]["architecture"] for m in index["manifests"])


def make_keys(work: Path) -> tuple[str, Path]:
    public, secret = minisign.generate_keypair(comment="release scale")
    key = work / "scale.key"
    key.write_text(secret)
    return public, key


def run_size(base: Path, size_gib: float, opts: argparse.Namespace) -> dict[str, Any]:
    """Every step at one size; the scratch filesystem and registry gone afterwards."""
    plans = plan_release(int(size_gib * GIB), opts.seed)
    work = base / f"size-{size_gib:g}"
    work.mkdir()
    scratch_bytes = int(5 * size_gib * GIB) + 4 * GIB  # vfs: unpacked is 3.5 x, + the store
    tmpdir = os.environ.get("TMPDIR")
    try:
        with scratch_fs(work / "scratch.img", work / "scratch", scratch_bytes) as scratch:
            (scratch / "tmp").mkdir()
            os.environ["TMPDIR"] = str(scratch / "tmp")  # skopeo's and the CLIs' temporary files
            result = measure_size(work, scratch, size_gib, plans, opts)
    finally:
        if tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = tmpdir
        shutil.rmtree(work, ignore_errors=True)
    return {"size_gib": size_gib, "release": describe(plans), **result}


def pushed_release(
    work: Path,
    scratch: Path,
    registry: Registry,
    plans: list[ImagePlan],
    label: str,
    *,
    logs: Path | None = None,
) -> tuple[Context, list[str]]:
    """The release of ``plans`` generated (or taken from the cache), pushed into
    ``registry`` and signed (a key pair and a signature store in ``work``): the steps'
    context, and the architectures the first payload image's index lists."""
    public, key = make_keys(work)
    progress(f"{label} GiB: generating (cached in {CACHE}) and pushing the release")
    release, _ = push_scaled_release(registry.url, registry.host, work, plans)
    index_platforms = platforms(registry.url, release.payload["component-000"])
    gpg = TestGpg.make(work / "gnupg")
    signature = gpg.sign(signature_document(release))
    gpg.close()
    sigs = write_signature_store(work / "sigs", release.digest, [signature])
    ctx = Context(scratch, used_bytes(scratch), public, release.ref, registry.host, sigs,
                  key, label, logs)  # fmt: skip
    return ctx, index_platforms


def measure_size(
    work: Path, scratch: Path, size_gib: float, plans: list[ImagePlan], opts: argparse.Namespace
) -> dict[str, Any]:
    steps: set[str] = set(opts.steps)
    found: list[Step] = []
    bundle = scratch / "bundle"
    with Registry(work / "registry") as registry:
        started = time.monotonic()
        ctx, index_platforms = pushed_release(
            work, scratch, registry, plans, f"{size_gib:g}", logs=opts.logs
        )
        push_s = time.monotonic() - started
        progress(f"{size_gib:g} GiB: step create")
        create = step_create(ctx, bundle, with_baseline="create" in steps)
    shutil.rmtree(work / "registry", ignore_errors=True)
    found += [create] if "create" in steps else []
    if "refused" in steps and size_gib == min(opts.sizes):  # a yes/no: at one size only
        progress(f"{size_gib:g} GiB: step refused")
        found.append(step_refused(ctx, bundle))
    with ext4_media(bundle, work) as media:
        found += node_steps(ctx, media, steps, opts.throttle_mbps)
        if "fanout" in steps and size_gib == fanout_size(opts):
            for nodes, rate in fanouts(opts):
                progress(f"{size_gib:g} GiB: step fanout, {nodes} nodes at {rate} Mbit/s")
                step = fanout(ctx, work / "media.img", media.size_bytes, work,
                              nodes=nodes, rate_mbit=rate)  # fmt: skip
                found += [step] if step is not None else []
    if "prepull" in steps and size_gib == fanout_size(opts):  # once a run: not sized
        progress("step prepull (bench/prepull.py's link profile)")
        found.append(prepull(work))
    return {
        "bundle_bytes": media.size_bytes,
        "bundle_images": create.extra["images"],
        "bundle_blobs": create.extra["blobs"],
        "index_architectures": index_platforms,
        "setup": {"generate_and_push_s": push_s, "create_s": create.nodeagent.seconds},
        "steps": [asdict(s) for s in found],
    }


def fanouts(opts: argparse.Namespace) -> list[tuple[int, int]]:
    """(nodes, Mbit/s) of each fan-out: every ``--fanout-nodes`` at 100 Mbit/s (the goal's
    rate), then 4 nodes at each other ``--fanout-rates`` (reported without PASS/MISS: at
    1 Gbit/s two CPUs bound it, not the link)."""
    runs = [(nodes, GOAL_RATE_MBIT) for nodes in opts.fanout_nodes]
    return runs + [(4, rate) for rate in opts.fanout_rates if rate != GOAL_RATE_MBIT]


def fanout_size(opts: argparse.Namespace) -> float:
    """The one size the fan-out runs at: the measured size nearest ``--fanout-gb`` (at 100
    Mbit/s it takes about 1.3 x S/R, 5 minutes at 2 GiB: at every size it would take the
    default run past its 40 minutes)."""
    sizes: list[float] = opts.sizes
    wanted = float(opts.fanout_gb)
    return min(sizes, key=lambda size: (abs(size - wanted), size))


def bench(base: Path, opts: argparse.Namespace) -> dict[str, Any]:
    tempfile.gettempdir()  # this process's own temporary files stay where they were
    logs.configure("warning")  # the keeper's lines (step refused) on stderr; stdout is the report
    started = time.monotonic()
    sizes = [run_size(base, size, opts) for size in opts.sizes]
    return {
        "sizes": sizes,
        "summary": summarize(sizes),
        "wall_s": time.monotonic() - started,
        "load_average": os.getloadavg(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.release_scale",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument(
        "--size-gb",
        type=float,
        default=6.0,
        help="release size, GiB of compressed blobs of one architecture (6)",
    )
    p.add_argument("--second-gb", type=float, help="the second size for the fit (a third)")
    p.add_argument("--quick", action="store_true", help="2 GiB alone, no fan-out or pre-pull")
    p.add_argument(
        "--steps",
        help=f"comma-separated, of {', '.join(STEPS)} "
        f"(default: all; --quick: {','.join(QUICK_STEPS)})",
    )
    p.add_argument("--fanout-gb", type=float, default=2.0,
                   help="the fan-out runs at the measured size nearest this (2)")  # fmt: skip
    p.add_argument("--fanout-nodes", default="4,8",
                   help="comma-separated node counts of the fan-out (4,8)")  # fmt: skip
    p.add_argument("--fanout-rates", default="100",
                   help="comma-separated link rates in Mbit/s; 4 nodes at each rate but "
                   "100 (e.g. 100,1000: the 1 Gbit/s figure, for information)")  # fmt: skip
    p.add_argument(
        "--throttle-mbps",
        type=float,
        help=f"also read and copy the stick throttled to this rate, MB/s ({STICK_MBPS:g}; "
        "--quick: not at all)",
    )
    p.add_argument("--seed", type=int, default=31, help="the release's seed (31)")
    p.add_argument("--workdir", type=Path, default=WORKDIR, help=f"parent of the work ({WORKDIR})")
    p.add_argument("--logs", type=Path, help="keep the import's stamped lines and CRI-O's log")
    p.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.size_gb, opts.second_gb = 2.0, 0.0
    second = opts.second_gb if opts.second_gb is not None else round(opts.size_gb / 3, 3)
    opts.sizes = [s for s in (second, opts.size_gb) if s > 0]
    if opts.throttle_mbps is None:
        opts.throttle_mbps = 0.0 if opts.quick else STICK_MBPS
    if opts.steps is None:
        opts.steps = ",".join(QUICK_STEPS if opts.quick else STEPS)
    opts.steps = [s for s in opts.steps.split(",") if s]
    opts.fanout_nodes = [int(n) for n in opts.fanout_nodes.split(",") if n]
    opts.fanout_rates = [int(r) for r in opts.fanout_rates.split(",") if r]
    unknown = set(opts.steps) - set(STEPS)
    if unknown:
        p.error(f"unknown steps: {', '.join(sorted(unknown))}")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    return run_as_root("bench.release_scale", "release-scale-", opts, bench, render_text)


def render_text(report: dict[str, Any]) -> str:
    return render(report)


if __name__ == "__main__":
    sys.exit(main())
