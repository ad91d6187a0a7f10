"""``nodeagent bundle create | verify | import`` (``nodeagent.cli.main`` registers them).

``create`` (``nodeagent.cli.bundle_create``) fetches images by digest from their registries
into an OCI layout and signs its ``bundle.json`` with a minisign secret key; ``verify``
checks a bundle directory the way the daemon will before importing it. Both print progress
on a terminal (stderr) and nothing else there otherwise. ``import`` runs the daemon's import
of a bundle directory (a mounted medium, or a copy on disk) by hand, then one sync to pin
its sets; it exits 0 when the bundle is imported (or already was), 65 when it is refused, 75
when the import was interrupted. The format is docs/bundle-format.md.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypeAlias

from nodeagent import logs
from nodeagent.adapters.pins_lock import PINS_LOCK_NAME, PinsLock
from nodeagent.bundles.target import describe_target
from nodeagent.cli import bundle_create, bundle_keys, bundle_medium, lifecycle, output
from nodeagent.cli import release as release_cli
from nodeagent.cli.bundle_create import parse_platform
from nodeagent.cli.terminal import TerminalProgress, out
from nodeagent.config import Config
from nodeagent.errors import DaemonRunning
from nodeagent.status import BundleReport, bundle_line, status_line
from nodeagent.strict import clip
from nodeagent.units import format_bytes

if TYPE_CHECKING:
    # Imported by the command that uses it: `nodeagent run` parses these arguments too.
    from nodeagent.adapters.bundles import tree as bundle_media

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_parser(sub: Subparsers) -> Subparsers:
    """Register ``bundle create`` and ``bundle verify``; return ``bundle``'s own subparsers.

    Another ``bundle`` subcommand registers its parser on the returned object and its
    function in ``BUNDLE_COMMANDS``.
    """
    parser = sub.add_parser("bundle", help="make and check offline upgrade bundles")
    commands = parser.add_subparsers(dest="bundle_command", required=True)
    bundle_create.add_parser(commands)
    verify = commands.add_parser("verify", help="check a bundle's signature and every byte")
    verify.add_argument("path", type=Path, help="the bundle's directory (a mounted medium)")
    verify.add_argument(
        "--trusted-keys", type=Path, help="directory of trusted *.pub/*.pem keys (default: config)"
    )
    verify.add_argument(
        "--arch", type=parse_platform, default=None,
        help="the node's platform, which the bundle must be for (default: the bundle's own)",
    )  # fmt: skip
    imports = commands.add_parser("import", help="import a bundle directory now and pin its sets")
    imports.add_argument(
        "path", type=Path,
        help="the bundle's directory, or the stick itself: a device (/dev/sdb1) or "
        "LABEL=NAME, mounted read-only by the command and unmounted after",
    )  # fmt: skip
    imports.add_argument(
        "--ignore-target", action="store_true",
        help="import even when the bundle's target selector leaves this node out "
        "(its architecture is still checked)",
    )  # fmt: skip
    imports.add_argument(
        "--allow-rollback", action="store_true",
        help="import even when the node accepted a newer bundle of the same signing key and "
        "channel (going back on purpose; logged as a warning)",
    )  # fmt: skip
    imports.add_argument(
        "--allow-expired", action="store_true",
        help="import even when the bundle's signed expiry time is past (logged as a warning)",
    )  # fmt: skip
    release_cli.add_parser(commands)
    bundle_keys.add_parser(commands)
    lifecycle.add_remove_parser(commands)
    return commands


def cmd_bundle(config: Config, args: argparse.Namespace) -> int:
    return BUNDLE_COMMANDS[args.bundle_command](config, args)


# ---------------------------------------------------------------- verify
def cmd_verify(config: Config, args: argparse.Namespace) -> int:
    from nodeagent.adapters.bundles import tree as bundle_media  # noqa: PLC0415  (see the imports)

    keys_dir = args.trusted_keys or config.bundles.trusted_keys_dir
    progress = TerminalProgress() if sys.stderr.isatty() else None
    try:
        report = bundle_media.verify_bundle(
            args.path,
            keys_dir,
            platform=args.arch,
            on_progress=progress.hashed if progress else None,
            fips_switch=config.bundles.fips_switch,
        )
    finally:
        if progress is not None:
            progress.close()
    if args.json:
        output.print_json("bundle-verify", report.to_json())
    else:
        print_report(report)
    if report.error is not None:
        output.print_error(report.error.reason, report.error.message)
        return report.error.exit_code
    return 0


def print_report(report: bundle_media.VerifyReport) -> None:
    """The report for a person; every text from the bundle goes through ``strict.clip``."""
    manifest, verified = report.manifest, report.verified
    verdict = "authentic and complete" if report.is_ok else "REFUSED"
    out(f"bundle {clip(manifest.bundle_id if manifest else report.path)}: {verdict}")
    if verified is not None:
        name = f" ({clip(verified.key_name, 100)})" if verified.key_name else ""
        comment = clip(verified.trusted_comment, 200)
        out(f"  signed by key {verified.key_id_hex}{name}: {comment}")
        out(f"  signatures verified: {', '.join(verified.schemes)}")
    if manifest is None:
        return
    out(
        f"  created {clip(manifest.created, 40)}, architecture {clip(manifest.architecture, 40)}, "
        f"{len(manifest.images)} images, {len(manifest.sets)} PinnedImageSets"
    )
    out(f"  for {describe_target(manifest.architecture, manifest.target)}")
    expiry = f", expires {clip(manifest.expires, 40)}" if manifest.expires else ""
    out(f"  channel {clip(manifest.channel, 70)}, sequence {manifest.sequence}{expiry}")
    rate = report.hashed_bytes / report.seconds / 1e6 if report.seconds > 0 else 0.0
    out(
        f"  {len(manifest.files)} files, {format_bytes(report.hashed_bytes)} hashed in "
        f"{report.seconds:.1f} s ({rate:.0f} MB/s)"
    )
    signed = {str(s.image) for s in manifest.image_signatures}
    for image in manifest.images:
        mark = ", sigstore signature carried" if str(image.ref) in signed else ""
        out(f"  {image.ref} ({format_bytes(image.size_bytes)}{mark})")


# ---------------------------------------------------------------- import
EXIT_REFUSED = 65
EXIT_INTERRUPTED = 75


def cmd_import(config: Config, args: argparse.Namespace) -> int:
    """Import, holding the daemon's pin lock (decision 0044): a by-hand import beside a
    running daemon raced it for the pins; it is refused now (``DaemonRunning``, 75).

    ``path`` may be a block device or ``LABEL=NAME``: the command mounts it read-only
    itself and unmounts it after (``cli.bundle_medium``). The daemon's log lines are
    printed when the import succeeds; a failure is one ``error:`` line (decision 0073)."""
    lines = io.StringIO()
    logs.configure(config.log.level, stream=lines)
    overrides = Overrides(args.ignore_target, args.allow_rollback, args.allow_expired)
    device = bundle_medium.device_of(str(args.path))
    lock = PinsLock(config.state.run_dir / PINS_LOCK_NAME)
    if not lock.try_acquire():
        busy = DaemonRunning(
            f"the nodeagent daemon (process {lock.holder()}) is running and owns this node's "
            "pins, so a by-hand import would race it"
        )
        output.print_error(busy.reason, busy.message)
        return busy.exit_code
    try:
        if device is None:
            report = asyncio.run(
                _import(config, args.path.resolve(), overrides, is_json=args.json, said=lines)
            )
        else:
            with bundle_medium.mounted(config, device) as root:
                report = asyncio.run(
                    _import(config, root, overrides, is_json=args.json, said=lines)
                )
    finally:
        lock.release()
    return _said(report, lines.getvalue(), is_json=args.json)


def _said(report: BundleReport, lines: str, *, is_json: bool) -> int:
    """The import's outcome: its JSON and log lines, or one ``error:`` line."""
    if is_json:
        output.print_json("bundle-import", report.to_json())
    if report.state == "imported":
        sys.stderr.write(lines)
        return 0
    output.print_error(report.reason or "BundleIncomplete", report.message or report.state)
    return EXIT_INTERRUPTED if report.state == "interrupted" else EXIT_REFUSED


@dataclass(frozen=True, slots=True)
class Overrides:
    """``bundle import``'s flags: rules a technician sets aside by hand (each logged)."""

    is_ignoring_target: bool = False
    is_allowing_rollback: bool = False
    is_allowing_expired: bool = False


async def _import(
    config: Config, root: Path, overrides: Overrides, *, is_json: bool = False, said: TextIO
) -> BundleReport:
    """The import, then one sync; its line on stdout, or stderr when stdout is for JSON.
    ``said``: where the journal's lines and the 'stored' line go until the outcome is known."""
    from nodeagent.daemon.bundles import build_importer  # noqa: PLC0415  (see the imports)
    from nodeagent.daemon.wiring import build  # noqa: PLC0415  (see the imports)

    wiring = build(config, keeps_last_status=True)  # a refusal before the sync keeps the sets
    progress = TerminalProgress() if sys.stderr.isatty() else None

    def on_report(report: BundleReport) -> None:
        if progress is not None:
            progress.bundle(report)
        elif report.state == "stored":
            said.write(f"{bundle_line(report)}\n")

    try:
        labels = None
        if wiring.cluster is not None and not overrides.is_ignoring_target:
            labels = await wiring.cluster.specs.read_node_labels()
        importer = build_importer(
            config, wiring.policies, wiring.cri, wiring.reloader, report=on_report,
            node_labels=lambda: labels, is_ignoring_target=overrides.is_ignoring_target,
            is_allowing_rollback=overrides.is_allowing_rollback,
            is_allowing_expired=overrides.is_allowing_expired,
        )  # fmt: skip
        report = await importer.import_bundle(root, source=str(root))
        wiring.reporter.bundle_report(report)  # the status file's bundles, as the daemon's
        if report.state == "imported":
            if report.next_steps:  # a release: its signatures to the CVO, or how to
                from nodeagent.daemon.bundles import signature_publisher  # noqa: PLC0415

                api = wiring.cluster.api if wiring.cluster else None
                await signature_publisher(config, api).publish(report.bundle_id)
            status = await wiring.reconciler.sync()
            wiring.reporter.sync_finished(status)
            print(f"sync: {status_line(status)}", file=sys.stderr if is_json else sys.stdout)
        return report
    finally:
        if progress is not None:
            progress.close()
        await wiring.close()


BUNDLE_COMMANDS: dict[str, Callable[[Config, argparse.Namespace], int]] = {
    "create": bundle_create.cmd_create,
    "verify": cmd_verify,
    "import": cmd_import,
    "keygen": bundle_keys.cmd_keygen,
    "release-signatures": release_cli.cmd_release_signatures,
    "remove": lifecycle.cmd_remove,
}
