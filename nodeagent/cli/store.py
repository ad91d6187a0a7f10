"""``nodeagent store`` and ``nodeagent store verify`` (``nodeagent.cli.main`` registers them).

``store`` shows what the node's image store keeps, why, and the space it takes (read
only). ``store verify`` re-hashes every stored blob, removes and reports each one that no
longer matches its digest, and exits 0 when every blob matched, 74 (``StoreBlobCorrupt``)
when it removed any, or the code of the error that stopped it. Text from bundles (set,
image and key names) is clipped and escaped (``strict.clip``). docs/store.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from typing import TYPE_CHECKING, TypeAlias

from nodeagent import logs
from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.host import read_boot_id
from nodeagent.cli import output
from nodeagent.config import Config
from nodeagent.errors import StoreBlobCorrupt
from nodeagent.ledger import LedgerStore
from nodeagent.store.keeping import KeepRules
from nodeagent.strict import clip
from nodeagent.units import format_bytes

if TYPE_CHECKING:
    # Imported by the commands that use them: `nodeagent run` parses these arguments too.
    from nodeagent.adapters.store import keeper
    from nodeagent.store.keeping import BundleVerdict

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

EXIT_CORRUPT = StoreBlobCorrupt.exit_code


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser("store", help="what the node's image store keeps, why, and its size")
    commands = parser.add_subparsers(dest="store_command", required=False)
    commands.add_parser("verify", help="re-hash every stored blob; remove corrupt ones")


def rules_of(config: Config) -> KeepRules:
    return KeepRules(config.store.gc_grace_s, config.store.keep_newest_per_channel)


def pinned_sets(config: Config) -> set[str]:
    """Sets pinned at some generation, as the ledger remembers them (read, never repaired)."""
    loaded = LedgerStore(JsonStateStore(config.state.dir), read_boot_id()).load(is_repairing=False)
    return {
        name
        for name, record in loaded.ledger.sets.items()
        if record.current_generation is not None or record.pinned_images
    }


def cmd_store(config: Config, args: argparse.Namespace) -> int:
    from nodeagent.adapters.store import keeper  # noqa: PLC0415  (see the imports)

    logs.configure(config.log.level)  # journal-style lines on stderr; stdout is the report
    if args.store_command == "verify":
        return cmd_verify(config, args)
    from nodeagent.adapters.bundles.agent_image import self_digests  # noqa: PLC0415

    view = keeper.inspect_store(
        config.store_dir, pinned_sets(config), rules_of(config), time.time(), with_tags=True,
        self_digests=self_digests(os.environ),
    )  # fmt: skip
    if args.json:
        output.print_json("store", view.to_json())
        return 0
    print_view(view)
    return 0


def _when(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def print_view(view: keeper.StoreView) -> None:
    print(
        f"store {view.root}: {format_bytes(view.stored_bytes)} in {len(view.stored)} blobs, "
        f"{format_bytes(view.releasable_bytes)} of it no longer needed, "
        f"{format_bytes(view.partial_bytes)} in unfinished copies"
    )
    if not view.verdicts:
        print("no bundles or registry sets stored")
    for verdict in view.verdicts:
        _print_bundle(view, verdict)
    if view.removals.held:
        first = min(view.removals.held.values())
        print(f"{len(view.removals.held)} unneeded blobs are removed from {_when(first)} on")
    for repair in view.repairs:
        print(f"record rebuilt: {clip(repair, 300)}")


def _print_bundle(view: keeper.StoreView, verdict: BundleVerdict) -> None:
    record = verdict.record
    own, shared = view.own_bytes(verdict)
    key = clip(record.key_name, 60) or record.key_id
    if record.is_registry:
        print(
            f"registry set {clip(record.bundle_id, 260)} (fetched {clip(record.created, 40)}): "
            + clip(verdict.describe())
        )
    else:
        print(
            f"bundle {clip(record.bundle_id, 130)} (key {key} {record.key_id}, channel "
            f"{clip(record.channel, 70)}{_sequence(record.sequence)}, created "
            f"{clip(record.created, 40)}): " + clip(verdict.describe())
        )
    sets = ", ".join(clip(name, 100) for name in record.sets) or "none"
    print(
        f"  {format_bytes(own)} its own, {format_bytes(shared)} shared with other bundles; "
        f"{len(record.images)} images; sets {sets}"
    )
    for tag, digest in view.frozen_tags.get(record.bundle_id, {}).items():
        print(
            f"  frozen tag {clip(tag, 400)} -> {digest} (served as signed while a mirror serves it)"
        )


def cmd_verify(config: Config, args: argparse.Namespace) -> int:
    from nodeagent.adapters.store import keeper  # noqa: PLC0415  (see the imports)

    on_bytes = _TerminalLine().show if sys.stderr.isatty() and not args.json else None
    report = (
        keeper.verify(config.store_dir, on_bytes) if on_bytes else keeper.verify(config.store_dir)
    )
    if on_bytes:
        sys.stderr.write("\n")
    if args.json:
        output.print_json("store-verify", report.to_json())
    else:
        rate = report.checked_bytes / report.seconds / 1e6 if report.seconds > 0 else 0.0
        print(
            f"checked {report.checked} blobs, {format_bytes(report.checked_bytes)} in "
            f"{report.seconds:.1f} s ({rate:.0f} MB/s): "
            + ("all match their digests" if report.is_ok else f"{len(report.corrupt)} CORRUPT")
        )
        for digest, message in report.corrupt:
            print(f"removed {digest}: {StoreBlobCorrupt.reason}: {clip(message, 300)}")
    if report.is_ok:
        return 0
    output.print_error(
        StoreBlobCorrupt.reason,
        f"{len(report.corrupt)} corrupt blob(s) removed from the store {config.store_dir}; "
        "plug the bundle's medium in again to restore them, and check the disk",
    )
    return EXIT_CORRUPT


class _TerminalLine:
    """``hashed 1.2 GiB/4 GiB`` on stderr, at most every 0.2 s."""

    def __init__(self) -> None:
        self.shown_s = 0.0

    def show(self, done: int, total: int) -> None:
        now_s = time.monotonic()
        if now_s - self.shown_s >= 0.2 or done >= total:
            self.shown_s = now_s
            sys.stderr.write(f"\rhashed {format_bytes(done)}/{format_bytes(total)}   ")
            sys.stderr.flush()


def _sequence(sequence: int | None) -> str:
    """``, sequence N`` (a record written before sequences were recorded: nothing)."""
    return "" if sequence is None else f", sequence {sequence}"
