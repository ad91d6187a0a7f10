"""The ``nodeagent`` command line.

Every failure prints ``error: <Reason>: <what happened and what to do>`` on
stderr and exits with that error's ``exit_code`` (see ``nodeagent.errors``);
``--json`` output is meant for scripts. ``--root`` puts every host path under
a prefix (tests, chroots).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nodeagent import __version__, logs
from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.crio_config import CrioDropins
from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.host import read_boot_id
from nodeagent.adapters.journald import JournalSink
from nodeagent.adapters.pins_lock import PINS_LOCK_NAME, PinsLock
from nodeagent.adapters.systemd import RuntimeReloader
from nodeagent.config import DEFAULT_CONFIG_PATH, Config, load_config
from nodeagent.daemon import root as daemon
from nodeagent.errors import NodeAgentError, SpecInvalid, StateFileDamaged
from nodeagent.ledger import LedgerStore
from nodeagent.pins import foreign_pins, render_dropin
from nodeagent.ports import StoredImage
from nodeagent.specs import load_spec_dirs
from nodeagent.strict import clip
from nodeagent.units import format_bytes

MODULE_COMMANDS = ("bundle", "store", "site")
"""Commands of their own module (``nodeagent.cli.<command>``), loaded only when a command
line other than ``run`` is parsed: the daemon never loads them (0.7 MiB of its idle
memory, docs/performance.md)."""


def _command_of(argv: Sequence[str] | None) -> str | None:
    """The command word of a command line, found without the full parser."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--config")
    early.add_argument("--root")
    early.add_argument("command", nargs="?")
    known, _rest = early.parse_known_args(argv)
    return str(known.command) if known.command else None


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; for ``run``, without the other commands' modules."""
    parser = argparse.ArgumentParser(
        prog="nodeagent", description="Pin and pre-load container images on a CRI-O node."
    )
    parser.add_argument("--version", action="version", version=f"nodeagent {__version__}")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH, help="main config file")
    parser.add_argument(
        "--root",
        type=Path,
        default=os.environ.get("NODEAGENT_ROOT") or None,
        help="put every host path under this directory (env NODEAGENT_ROOT)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the daemon (systemd starts it)")
    if command == "run":
        return parser
    sub.add_parser("check-config", help="validate the configuration and every PinnedImageSet")
    render = sub.add_parser("render-pins", help="print the CRI-O pin drop-in nodeagent would write")
    render.add_argument(
        "--write",
        action="store_true",
        help="write it (and its link) instead; used at boot before CRI-O starts",
    )
    render.add_argument(
        "--reload",
        action="store_true",
        help="with --write: reload CRI-O when the file changed (the path unit that follows "
        "the other CRI-O drop-ins)",
    )
    status = sub.add_parser("status", help="what nodeagent did: sets, images, disk, errors")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    runtime = sub.add_parser("runtime", help="show the runtime, its image filesystem and images")
    runtime.add_argument("--json", action="store_true", help="machine-readable output")
    offline = sub.add_parser(
        "check-offline", help="what would break here if the registry vanished now (docs/offline.md)"
    )
    offline.add_argument("--json", action="store_true", help="machine-readable output")
    pull = sub.add_parser("pull", help="pull images through the runtime (by digest)")
    pull.add_argument("images", nargs="+", metavar="IMAGE")
    for name in MODULE_COMMANDS:
        importlib.import_module(f"nodeagent.cli.{name}").add_parser(sub)
    return parser


# ---------------------------------------------------------------- commands
def cmd_run(config: Config, _args: argparse.Namespace) -> int:
    sink = JournalSink() if JournalSink.is_wanted() else None
    logs.configure(
        config.log.level,
        with_priority="JOURNAL_STREAM" in os.environ,
        journal=sink.send if sink else None,
    )
    return asyncio.run(daemon.run(config))


def cmd_check_config(config: Config, _args: argparse.Namespace) -> int:
    load = load_spec_dirs(config.spec_dirs())
    files = ", ".join(str(f) for f in config.files) or f"{config.source} (defaults: file absent)"
    print(f"config: ok ({files})")
    for s in load.sets:
        kind = "persistent" if s.is_persistent else "transient"
        print(f"set {s.name}: ok, {len(s.images)} images, {kind}, from {s.source}")
    for problem in load.problems:
        where = f"{problem.source}" + (f" ({problem.object_name})" if problem.object_name else "")
        print(f"error: {problem.reason}: {where}: {problem.message}", file=sys.stderr)
    return SpecInvalid.exit_code if load.problems else 0


def _dropins(config: Config) -> CrioDropins:
    rt = config.runtime
    return CrioDropins(rt.config_file, rt.config_dir, rt.transient_dropin_dir, rt.dropin_name)


def cmd_render_pins(config: Config, args: argparse.Namespace) -> int:
    """The pins remembered from before plus every other file's (the unit's ExecStartPre, and
    the path unit's command when another CRI-O drop-in changed: decision 0044).

    Never fails on damaged state: a damaged ledger is read around (its last good copy and
    the last rendered boot pins), with a warning; the daemon sets it aside and rebuilds.
    ``--write`` takes the pin lock the daemon holds while it runs; held, it leaves the file
    to the daemon, which follows the same directories. Unchanged bytes: no write, no reload.
    """
    logs.configure(config.log.level, with_priority="JOURNAL_STREAM" in os.environ)
    dropins = _dropins(config)
    if not args.write:
        print(_render(config, dropins), end="")
        return 0
    lock = PinsLock(config.state.run_dir / PINS_LOCK_NAME)
    if not lock.try_acquire():
        print(
            f"skipped: process {lock.holder()} holds {lock.path}: the nodeagent daemon, which "
            "renders the pins itself, or another render-pins"
        )
        return 0
    try:
        is_changed = False
        for _ in range(MAX_RENDER_ROUNDS):  # a file changed while this one was written
            if not dropins.write_dropin(_render(config, dropins)):
                break
            is_changed = True
        state = "wrote" if is_changed else "unchanged"
        print(f"{state}: {dropins.target} (linked from {dropins.link})")
        if is_changed and args.reload:
            rt = config.runtime
            reloader = RuntimeReloader(rt.unit, pid_file=rt.pid_file, timeout_s=rt.reload_timeout_s)
            print(f"reloaded {rt.unit} ({asyncio.run(reloader.reload())})")
    finally:
        lock.release()
    return 0


MAX_RENDER_ROUNDS = 3
"""Renders per ``render-pins --write``: again while the last one still changed the file."""


def _render(config: Config, dropins: CrioDropins) -> str:
    store = LedgerStore(JsonStateStore(config.state.dir), read_boot_id())
    remembered = store.load(is_repairing=False).remembered_pins()
    foreign = foreign_pins(dropins.read_other_configs())
    for problem in foreign.problems:  # CRI-O will refuse to start until it is fixed
        print(f"warning: RuntimeConfigInvalid: {problem.message}", file=sys.stderr)
    return render_dropin([*remembered, *foreign.patterns])


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    doc = JsonStateStore(config.state.dir).load("status")  # StateFileDamaged: exit 74
    if doc is None:
        print("no status yet: nodeagent has not finished a sync (is the service running?)")
        return 1
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    try:
        print_status(doc)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise StateFileDamaged(
            f"the status file has an unexpected shape ({clip(exc, 80)}); the daemon sets it "
            "aside and writes it anew at its next sync"
        ) from exc
    return 0


def _say(text: str) -> None:
    """One line of the status file for a terminal: escape sequences escaped, clipped."""
    print(clip(text, 2000))


def print_status(doc: dict[str, Any]) -> None:
    images = doc.get("images", {})
    _say(f"updated: {doc.get('updatedAt', '?')}   runtime: {doc.get('runtime', '?')}")
    if doc.get("osImage"):
        _say(_os_text(doc["osImage"]))
    for cond in doc.get("conditions", []):
        _say(f"{cond['type']:<12} {cond['status']:<6} {cond['reason']}: {cond['message']}")
    _say(
        f"images: {images.get('pinned', 0)}/{images.get('total', 0)} pinned, "
        f"{images.get('failed', 0)} failed"
    )
    disk = doc.get("disk")
    if disk:
        _say(
            f"disk: {format_bytes(disk['availableBytes'])} available on {disk['mountpoint']}, "
            f"{format_bytes(disk['neededBytes'])} needed, "
            f"{format_bytes(disk['reserveBytes'])} kept free"
        )
    for s in doc.get("pinnedImageSets", []):
        _print_set(s)
    _print_notes(doc)
    if doc.get("retryInSeconds") is not None:
        _say(f"retrying in {doc['retryInSeconds']} s (transient failure)")
    if doc.get("lastError"):
        _say(f"last error: {doc['lastError']}")


def _print_notes(doc: dict[str, Any]) -> None:
    """Spec problems, rebuilt state, bundles, and pinned images the runtime lost."""
    for problem in doc.get("specProblems", []):
        _say(
            f"invalid spec {problem['file']} ({problem['set']}): {problem['reason']}: "
            f"{problem['message']}"
        )
    for repair in doc.get("stateRepairs", []):
        kept = f" (kept as {repair['movedTo']})" if repair.get("movedTo") else ""
        _say(f"state rebuilt: {repair['file']}: {repair['reason']}: {repair['message']}{kept}")
    for bundle in doc.get("bundles", []):
        _say(_bundle_text(bundle))
        for step in bundle.get("nextSteps", []):
            _say(f"  next: {step}")
        for warning in bundle.get("warnings", []):
            _say(f"  warning {warning.get('reason')}: {warning.get('message', '')}")
    loss = doc.get("imageLoss")
    if loss:
        _say(f"images lost at {loss['at']}: {loss['reason']}: {loss['message']}")
        if loss.get("restoredFromStore"):
            _say(f"restored {loss['restoredFromStore']} images from the local store")


def _os_text(image: dict[str, Any]) -> str:
    """'os: rhcos 4.18 (418.94…), booted quay.io/…@sha256:… (rpm-ostree)'."""
    text = f"os: {image.get('id', '?')} {image.get('versionId', '?')}"
    if image.get("version"):
        text += f" ({image['version']})"
    booted = image.get("booted") or {}
    if booted:
        text += f", booted {booted.get('image')} ({booted.get('source')})"
    return text


def _bundle_text(bundle: dict[str, Any]) -> str:
    images = bundle.get("images") or {}
    text = (
        f"bundle {bundle.get('bundleId') or bundle.get('source')}: {bundle.get('state')}, "
        f"images {images.get('present', 0)}/{images.get('total', 0)}"
    )
    if bundle.get("mediumRemovable"):
        text += ", the medium may be removed"
    progress = bundle.get("progress") or {}
    if progress.get("text"):
        text += f": {progress['text']}"
    if bundle.get("reason"):
        text += f" ({bundle['reason']}: {bundle.get('message', '')})"
    return text


def _print_set(s: dict[str, Any]) -> None:
    imgs = s["images"]
    gen = f"generation {s.get('currentGeneration', '-')}/{s['desiredGeneration']}"
    _say(
        f"set {s['name']}: {s['state']} ({gen}), images {imgs['pinned']} pinned, "
        f"{imgs['present']} present, {imgs['total']} total, {imgs['failed']} failed"
    )
    for failed in s.get("failedImages", []):
        _say(f"  {failed['reason']}: {failed['image']}: {failed['message']}")
    if s.get("lastFailedGenerationError") and not s.get("failedImages"):
        _say(f"  {s.get('reason', 'Failed')}: {s['lastFailedGenerationError']}")


def _image_row(image: StoredImage) -> str:
    name = (image.repo_digests or image.repo_tags or (image.id,))[0]
    pin = "pinned" if image.is_pinned else "-"
    return f"{pin:<7} {image.size_bytes / 1e6:>9.1f} MB  {name}"


async def _runtime(endpoint: str, as_json: bool) -> int:
    async with CriClient(endpoint) as cri:
        version = await cri.version()
        filesystems = await cri.image_fs_info()
        images = await cri.list_images()
    if as_json:
        doc = {
            "runtime": {"name": version.runtime_name, "version": version.runtime_version},
            "imageFilesystems": [fs.mountpoint for fs in filesystems],
            "images": [
                {
                    "id": i.id,
                    "names": list(i.names()),
                    "sizeBytes": i.size_bytes,
                    "pinned": i.is_pinned,
                }
                for i in images
            ],
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"runtime: {version.runtime_name} {version.runtime_version} "
        f"(CRI {version.runtime_api_version})"
    )
    for fs in filesystems:
        print(f"image filesystem: {fs.mountpoint}")
    pinned = sum(1 for i in images if i.is_pinned)
    print(f"images: {len(images)} stored, {pinned} pinned")
    for image in images:
        print("  " + _image_row(image))
    return 0


def cmd_runtime(config: Config, args: argparse.Namespace) -> int:
    return asyncio.run(_runtime(config.runtime.endpoint, args.json))


async def _pull(endpoint: str, refs: Sequence[str]) -> int:
    async with CriClient(endpoint) as cri:
        for ref in refs:
            image_ref = await cri.pull_image(ref, timeout_s=3600)
            print(f"pulled {ref} -> {image_ref}")
    return 0


def cmd_pull(config: Config, args: argparse.Namespace) -> int:
    return asyncio.run(_pull(config.runtime.endpoint, args.images))


def cmd_check_offline(config: Config, args: argparse.Namespace) -> int:
    from nodeagent.cli import offline  # noqa: PLC0415  (not loaded by the daemon)

    return offline.cmd_check_offline(config, args.json)


COMMANDS = {
    "run": cmd_run,
    "check-config": cmd_check_config,
    "render-pins": cmd_render_pins,
    "status": cmd_status,
    "runtime": cmd_runtime,
    "pull": cmd_pull,
    "check-offline": cmd_check_offline,
}


def _command(name: str) -> Callable[[Config, argparse.Namespace], int]:
    if name in COMMANDS:
        return COMMANDS[name]
    module = importlib.import_module(f"nodeagent.cli.{name}")
    function: Callable[[Config, argparse.Namespace], int] = getattr(module, f"cmd_{name}")
    return function


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser(_command_of(argv)).parse_args(argv)
    try:
        config = load_config(args.config, root=args.root)
        return _command(args.command)(config, args)
    except NodeAgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
