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
    fanout   (optional) bench.scale_fanout.fanout_step, when that module exists

Each at ``--size-gb`` (GiB of compressed blobs, one architecture) and at a second, smaller
size; per-GiB slopes and intercepts are fitted and extrapolated to 16 GiB. Run as root::

    python -m bench.release_scale [--size-gb 6] [--second-gb 2] [--steps ...] [--json]
    python -m bench.release_scale --quick          # 2 GiB and 0.25 GiB
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.bundle_import import drop_caches, ext4_media, run_as_root
from bench.prepull import progress
from bench.scale_measure import GIB, scratch_fs, used_bytes
from bench.scale_release import CACHE, describe, plan_release, push_scaled_release
from bench.scale_report import render, summarize
from bench.scale_steps import Context, Step, node_steps, step_create, step_refused
from nodeagent.bundles import minisign
from tests.testenv.registry import Registry
from tests.testenv.release import TestGpg, signature_document, write_signature_store

STEPS = ("create", "refused", "copy", "verify", "import", "restore", "fanout")
WORKDIR = Path("/var/tmp")  # noqa: S108 - a disk, not tmpfs; the run's directory is private
DEFAULT_STEPS = ("create", "refused", "copy", "verify", "import", "restore")


def fanout(ctx: Context, stick_image: Path, mountpoint: Path, work: Path) -> Step | None:
    """THE FAN-OUT CALL SITE: ``bench.scale_fanout.fanout_step`` (another module, written
    apart) gets the stick image (an ext4 image file, attached read-only and mounted at
    ``mountpoint`` meanwhile), the trusted public key and a work directory, and returns a
    dict of figures, kept as they are in the report. None when that module is absent."""
    try:
        module = importlib.import_module("bench.scale_fanout")
    except ImportError:
        progress("fanout: bench.scale_fanout is not in this tree; step skipped")
        return None
    fanout_step = module.fanout_step
    from bench.scale_steps import Side  # noqa: PLC0415

    started = time.monotonic()
    figures: dict[str, Any] = fanout_step(
        stick_image=stick_image, mountpoint=mountpoint, public_key=ctx.public_key, work=work
    )
    side = Side("fan-out (bench.scale_fanout)", time.monotonic() - started, {}, 0)
    return Step("fanout", side, None, {"figures": figures})


def make_keys(work: Path) -> tuple[str, Path]:
    public, secret = minisign.generate_keypair(comment="release scale")
    key = work / "scale.key"
    key.write_text(secret)
    return public, key


def run_size(base: Path, size_gib: float, opts: argparse.Namespace) -> dict[str, Any]:
    """Every step at one size; the scratch filesystem and registry gone afterwards."""
    steps: set[str] = set(opts.steps)
    plans = plan_release(int(size_gib * GIB), opts.seed)
    work = base / f"size-{size_gib:g}"
    work.mkdir()
    found: list[Step] = []
    setup: dict[str, float] = {}
    scratch_bytes = int(4 * size_gib * GIB) + 2 * GIB
    with scratch_fs(work / "scratch.img", work / "scratch", scratch_bytes) as scratch:
        (scratch / "tmp").mkdir()
        os.environ["TMPDIR"] = str(scratch / "tmp")  # skopeo's and the CLIs' temporary files
        public, key = make_keys(work)
        bundle = scratch / "bundle"
        with Registry(work / "registry") as registry:
            started = time.monotonic()
            progress(f"{size_gib:g} GiB: generating (cached in {CACHE}) and pushing the release")
            release, _ = push_scaled_release(registry.url, registry.host, work, plans)
            setup["generate_and_push_s"] = time.monotonic() - started
            gpg = TestGpg.make(work / "gnupg")
            sigs = write_signature_store(
                work / "sigs", release.digest, [gpg.sign(signature_document(release))]
            )
            gpg.close()
            drop_caches()
            ctx = Context(scratch, used_bytes(scratch), public, release.ref, registry.host,
                          sigs, key, f"{size_gib:g}", opts.logs)  # fmt: skip
            progress(f"{size_gib:g} GiB: step create")
            found.append(step_create(ctx, bundle, with_baseline="create" in steps))
        shutil.rmtree(work / "registry", ignore_errors=True)
        if "refused" in steps:
            progress(f"{size_gib:g} GiB: step refused")
            found.append(step_refused(ctx, bundle))
        with ext4_media(bundle, work) as media:
            found += node_steps(ctx, media, steps, opts.throttle_mbps)
            if "fanout" in steps:
                step = fanout(ctx, work / "media.img", media.mountpoint, work)
                found += [step] if step is not None else []
            bundle_bytes = media.size_bytes
    shutil.rmtree(work, ignore_errors=True)
    return {
        "size_gib": size_gib,
        "release": describe(plans),
        "bundle_bytes": bundle_bytes,
        "setup": setup,
        "steps": [asdict(s) for s in found if "create" in steps or s.name != "create"],
    }


def bench(base: Path, opts: argparse.Namespace) -> dict[str, Any]:
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
    p.add_argument("--quick", action="store_true", help="2 GiB and 0.25 GiB")
    p.add_argument(
        "--steps",
        default=",".join(DEFAULT_STEPS),
        help=f"comma-separated, of {', '.join(STEPS)} (default: all but fanout)",
    )
    p.add_argument(
        "--throttle-mbps",
        type=float,
        default=0.0,
        help="also read and copy the stick throttled to this rate (MB/s)",
    )
    p.add_argument("--seed", type=int, default=31, help="the release's seed (31)")
    p.add_argument("--workdir", type=Path, default=WORKDIR, help=f"parent of the work ({WORKDIR})")
    p.add_argument("--logs", type=Path, help="keep the import's stamped lines and CRI-O's log")
    p.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.size_gb, opts.second_gb = 2.0, 0.25
    second = opts.second_gb if opts.second_gb is not None else round(opts.size_gb / 3, 3)
    opts.sizes = [s for s in (second, opts.size_gb) if s > 0]
    opts.steps = [s for s in opts.steps.split(",") if s]
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
