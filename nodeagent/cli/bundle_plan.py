"""``nodeagent bundle create --dry-run``: the bundle's plan, printed, nothing written.

The plan is ``bundle create``'s own (``adapters.bundles.dry_run`` runs ``writer.plan_bundle``
in a scratch directory). Exit 0 when the bundle fits on the output's filesystem, 73
(``InsufficientDiskSpace``, the code ``bundle create`` stops with) when it does not, after
the report. ``--json``: ``nodeagent.bundle-create-dry-run/v1`` (docs/cli/).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nodeagent.authfile import AuthStore
from nodeagent.bundles.freshness import Freshness
from nodeagent.bundles.tags import ServedTag
from nodeagent.bundles.target import describe_target
from nodeagent.cli import output
from nodeagent.cli.terminal import out
from nodeagent.errors import InsufficientDiskSpace
from nodeagent.references import PinnedImageRef
from nodeagent.specs import PinnedImageSet
from nodeagent.strict import clip
from nodeagent.units import format_bytes

if TYPE_CHECKING:
    from nodeagent.adapters.bundles.dry_run import DryRun
    from nodeagent.adapters.bundles.release import ReleaseRequest
    from nodeagent.adapters.registry.client import RegistryClient


def cmd_dry_run(
    args: argparse.Namespace,
    refs: Sequence[PinnedImageRef],
    sets: Sequence[PinnedImageSet],
    *,
    client: RegistryClient,
    auth: AuthStore,
    now: datetime,
    freshness: Freshness,
    release: ReleaseRequest | None,
    served_tags: Sequence[ServedTag],
) -> int:
    from nodeagent.adapters.bundles.dry_run import dry_run  # noqa: PLC0415  (--dry-run only)

    plan = asyncio.run(
        dry_run(
            refs, sets, args.output, client=client, auth=auth, now=now, freshness=freshness,
            bundle_id=args.bundle_id, target=args.target_selector, release=release,
            with_signatures=args.with_signatures, served_tags=served_tags,
        )
    )  # fmt: skip
    if args.json:
        output.print_json("bundle-create-dry-run", to_json(plan, args))
    else:
        print_plan(plan, args)
    if plan.fits:
        return 0
    short = InsufficientDiskSpace(shortfall(plan))
    output.print_error(short.reason, short.message)
    return short.exit_code


def shortfall(plan: DryRun) -> str:
    return (
        f"{plan.measured_at} has {format_bytes(plan.disk.available_bytes)} free and the bundle "
        f"needs {format_bytes(plan.needed_bytes)} there: use a larger medium, or fewer images"
    )


def verdict(plan: DryRun) -> str:
    available, needed = plan.disk.available_bytes, plan.needed_bytes
    free = format_bytes(available)
    if plan.fits:
        return f"fits ({format_bytes(available - needed)} left of {free})"
    return f"DOES NOT FIT: {free} free, {format_bytes(needed - available)} short"


def print_plan(plan: DryRun, args: argparse.Namespace) -> None:
    out(
        f"dry run: bundle {plan.bundle_id} would hold {len(plan.images)} images, "
        f"{plan.blob_count} blobs, {format_bytes(plan.size_bytes)}; nothing was written"
    )
    out(f"  for {describe_target(args.arch.architecture, args.target_selector)}")
    if plan.release is not None:
        out(
            f"  release {clip(plan.release.version, 64)}: {plan.payload_count} payload images, "
            f"set {plan.release.set_name}, {len(plan.release.signatures)} signatures"
        )
    for image in plan.images:
        out(f"  {image.ref} ({format_bytes(image.size_bytes)}, {len(image.blobs)} blobs)")
    if args.with_signatures:
        out(f"  {len(plan.signatures)} of {len(plan.images)} images signed (sigstore)")
    out(
        f"  target {clip(str(plan.output), 300)} "
        f"(filesystem of {clip(str(plan.measured_at), 300)}): "
        f"needs {format_bytes(plan.needed_bytes)} in {plan.block_bytes}-byte blocks; "
        + verdict(plan)
    )


def to_json(plan: DryRun, args: argparse.Namespace) -> dict[str, Any]:
    """``bundle create --dry-run --json`` (docs/cli/bundle-create-dry-run.schema.json)."""
    release = plan.release
    return {
        "bundleId": plan.bundle_id,
        "architecture": args.arch.architecture,
        "images": [
            {"image": str(i.ref), "sizeBytes": i.size_bytes, "blobs": len(i.blobs)}
            for i in plan.images
        ],
        "blobs": plan.blob_count,
        "sizeBytes": plan.size_bytes,
        "signedImages": len(plan.signatures) if args.with_signatures else None,
        "release": None if release is None else {
            "version": release.version, "setName": release.set_name,
            "payloadImages": plan.payload_count, "signatures": len(release.signatures),
        },
        "target": {
            "path": str(plan.output),
            "measuredAt": str(plan.measured_at),
            "blockBytes": plan.block_bytes,
            "neededBytes": plan.needed_bytes,
            "availableBytes": plan.disk.available_bytes,
            "fits": plan.fits,
        },
    }  # fmt: skip
