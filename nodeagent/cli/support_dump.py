"""``nodeagent support-dump``: what a support engineer needs, in one bounded, secret-free
tar.gz (decision 0072).

Members: ``README.txt`` (what is in it, what was left out, the problems met),
``version.json`` (nodeagent, Python, kernel, whether the daemon runs), ``status.json``
(the daemon's status file), ``journal.txt`` (the newest lines of ``journalctl -u
nodeagent``), ``config.json`` (the effective configuration, secrets redacted:
``config.redact``), ``store.json`` (the store's bundles, counts and bytes: no blob data) and
``runtime.json`` (CRI-O's name and version from the CRI ``Version`` call). Files the
configuration names (auth files, kubeconfig, keys, certificates) are never opened.

The archive is at most ``--max-bytes`` (default 16 MiB): each member has a share of it
(the journal the rest), a member over its share is cut (the journal keeps its newest
lines) and says so. It is written atomically, mode 0600, never over an existing file. A
part that cannot be collected is a problem named in the archive and the output, not a
failure: the command exits 0 when the archive is written.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import platform
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeAlias

from nodeagent import __version__, logs
from nodeagent.adapters.pins_lock import PINS_LOCK_NAME, PinsLock
from nodeagent.cli import output
from nodeagent.config import Config
from nodeagent.config.redact import redact_doc, redact_text
from nodeagent.errors import NodeAgentError
from nodeagent.strict import clip
from nodeagent.units import format_bytes, parse_size

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

DEFAULT_MAX_BYTES: Final = 16 << 20
MIN_MAX_BYTES: Final = 64 << 10
MAX_MAX_BYTES: Final = 1 << 30
RESERVE_BYTES: Final = 32 << 10
"""Of the cap, kept for tar headers, padding and gzip's framing (incompressible data grows
by a few bytes per 64 KiB block)."""
RUNTIME_TIMEOUT_S: Final = 10.0
JOURNAL_UNREADABLE: Final = "JournalUnreadable"


def parse_max_bytes(text: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not MIN_MAX_BYTES <= value <= MAX_MAX_BYTES:
        raise argparse.ArgumentTypeError(f"{clip(text, 40)!r} is not between 64KiB and 1GiB")
    return value


def add_parser(sub: Subparsers) -> None:
    dump = sub.add_parser(
        "support-dump",
        help="write a bounded, secret-free tar.gz for support: status, journal excerpt, "
        "config (redacted), store summary, CRI-O version",
    )
    where = dump.add_mutually_exclusive_group()
    where.add_argument(
        "--output", type=Path, metavar="PATH",
        help="the archive to write (never over an existing file; default "
        "./nodeagent-support-<host>-<time>.tar.gz)",
    )  # fmt: skip
    where.add_argument(
        "--to-stick", action="store_true",
        help="write it to the one stick plugged in that nodeagent takes ([bundles] "
        "label_pattern, media_fs_types, media_buses), mounted nosuid,nodev,noexec and "
        "unmounted after",
    )  # fmt: skip
    dump.add_argument(
        "--max-bytes", type=parse_max_bytes, default=DEFAULT_MAX_BYTES, metavar="SIZE",
        help="the archive's size cap, 64KiB to 1GiB (default 16MiB); the journal excerpt "
        "keeps its newest lines within it",
    )  # fmt: skip


# ---------------------------------------------------------------- collecting
@dataclasses.dataclass
class Dump:
    cap: int
    members: list[tuple[str, bytes, bool]] = dataclasses.field(default_factory=list)
    problems: list[dict[str, str]] = dataclasses.field(default_factory=list)

    @property
    def used(self) -> int:
        return sum(len(data) for _, data, _ in self.members)

    def add(self, name: str, data: bytes, share: int, *, keep_tail: bool = False) -> None:
        share = max(share, 0)
        cut = len(data) > share
        if cut:
            note = f"\n[cut to {share} bytes of {len(data)} by the archive's cap]\n".encode()
            room = max(share - len(note), 0)
            data = (note + data[-room:]) if keep_tail else (data[:room] + note)
            data = data[:share]
        self.members.append((name, data, cut))

    def problem(self, member: str, reason: str, message: str) -> None:
        self.problems.append({"member": member, "reason": reason, "message": clip(message, 500)})


def _json(doc: object) -> bytes:
    return json.dumps(doc, indent=2, default=str, sort_keys=True).encode() + b"\n"


def _version(config: Config) -> bytes:
    lock = PinsLock(config.state.run_dir / PINS_LOCK_NAME)
    running = not lock.try_acquire()
    if not running:
        lock.release()
    return _json({
        "nodeagent": __version__, "python": platform.python_version(),
        "kernel": platform.release(), "machine": platform.machine(),
        "daemonRunning": running, "daemonPid": lock.holder() if running else None,
        "collectedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })  # fmt: skip


def _status(config: Config, dump: Dump, share: int) -> None:
    path = config.state.dir / "status.json"
    try:
        with path.open("rb") as stream:
            data = stream.read(share + 1)
    except FileNotFoundError:
        dump.problem("status.json", "HostFileError", f"{path} does not exist (no daemon run yet)")
        return
    except OSError as err:
        dump.problem("status.json", "HostFileError", f"cannot read {path}: {err.strerror}")
        return
    dump.add("status.json", redact_text(data.decode("utf-8", "replace")).encode(), share)


def _config(config: Config) -> bytes:
    doc = redact_doc(json.loads(json.dumps(dataclasses.asdict(config), default=str)))
    return _json({"files": [str(f) for f in config.files], "effective": doc})


def _store(config: Config) -> bytes:
    from nodeagent.adapters.store import keeper  # noqa: PLC0415
    from nodeagent.cli.store import pinned_sets, rules_of  # noqa: PLC0415

    if not config.store_dir.is_dir():
        return _json({"path": str(config.store_dir), "exists": False})
    view = keeper.inspect_store(
        config.store_dir, pinned_sets(config), rules_of(config), time.time()
    )
    return _json(redact_doc(view.to_json()))


async def _runtime(endpoint: str) -> bytes:
    from nodeagent.adapters.cri.client import CriClient  # noqa: PLC0415

    async with asyncio.timeout(RUNTIME_TIMEOUT_S), CriClient(endpoint) as cri:
        version = await cri.version()
    return _json({
        "endpoint": endpoint, "name": version.runtime_name,
        "version": version.runtime_version, "apiVersion": version.runtime_api_version,
    })  # fmt: skip


def collect(config: Config, cap: int) -> Dump:
    from nodeagent.adapters.support_archive import journal_excerpt  # noqa: PLC0415

    dump = Dump(cap)
    avail = cap - RESERVE_BYTES - 8192  # 8 KiB for README.txt
    dump.add("version.json", _version(config), 4096)
    try:
        dump.add("runtime.json", asyncio.run(_runtime(config.runtime.endpoint)), 16384)
    except (NodeAgentError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", "RuntimeUnreachable")
        dump.problem("runtime.json", reason, getattr(exc, "message", str(exc)) or reason)
    dump.add("config.json", _config(config), min(256 << 10, avail // 8))
    try:
        dump.add("store.json", _store(config), avail // 8)
    except NodeAgentError as exc:
        dump.problem("store.json", exc.reason, exc.message)
    _status(config, dump, avail // 4)
    room = avail - dump.used
    journal = asyncio.run(journal_excerpt("nodeagent", room))
    if journal.problem:
        dump.problem("journal.txt", JOURNAL_UNREADABLE, journal.problem)
    else:
        text = journal.text or (
            "(journalctl -u nodeagent returned no lines: no journal files on this host, or "
            "the unit logged nothing)\n"
        )
        dump.add("journal.txt", redact_text(text).encode(), room, keep_tail=True)
    dump.add("README.txt", _readme(dump).encode(), 8192)
    return dump


def _readme(dump: Dump) -> str:
    lines = [
        "nodeagent support dump (nodeagent support-dump; docs/operations.md)",
        f"cap: {format_bytes(dump.cap)}; members:",
        *(f"  {name}: {len(data)} bytes{', CUT to its share' if cut else ''}"
          for name, data, cut in dump.members),
        "left out on purpose: the files the configuration names (auth files, kubeconfig,",
        "keys, certificates), blob data; secrets in the configuration and journal are",
        "replaced by <redacted>",
        "problems:" if dump.problems else "problems: none",
        *(f"  {p['member']}: {p['reason']}: {p['message']}" for p in dump.problems),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the stick
def find_stick(config: Config) -> tuple[str, str, str]:
    """(device node, filesystem, label) of the one stick nodeagent takes, as the daemon's
    media watcher sees them (``adapters.bundles.udev``); else ``StickNotFound``."""
    from nodeagent.adapters.bundles.udev import MediaWatcher  # noqa: PLC0415
    from nodeagent.bundles.media import MediaEvent, MediaKind  # noqa: PLC0415
    from nodeagent.errors import StickNotFound  # noqa: PLC0415

    media = config.bundles

    async def present() -> list[MediaEvent]:
        watcher = MediaWatcher(
            media.label_pattern, fs_types=media.media_fs_types, buses=media.media_buses
        )
        async with watcher:
            return [e for e in watcher.existing() if e.kind == MediaKind.ARRIVED]

    found = asyncio.run(present())
    if len(found) != 1:
        names = ", ".join(f"{e.devnode} ({clip(e.label, 40)})" for e in found[:8])
        which = f"{len(found)} are: {names}" if found else "none is"
        raise StickNotFound(
            f"--to-stick needs one stick labelled {clip(media.label_pattern, 40)} "
            f"({', '.join(media.media_fs_types)}, on {', '.join(media.media_buses)}); {which}"
        )
    return found[0].devnode, found[0].fs_type, found[0].label


def to_stick(config: Config, name: str, write: Callable[[Path], int]) -> tuple[Path, int]:
    """Mount the stick writable (nosuid, nodev, noexec) in the run directory, ``write``
    the archive there as ``name``, unmount; (where it was written, its size)."""
    from nodeagent.adapters.bundles.mount import mount_for_writing  # noqa: PLC0415

    devnode, fs_type, label = find_stick(config)
    with mount_for_writing(devnode, fs_type, config.state.run_dir / "support-stick") as mount:
        size = write(mount.target / name)
    return Path(f"{devnode} ({label})") / name, size


# ---------------------------------------------------------------- the command
def default_output() -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    host = "".join(c if c.isalnum() or c in "-." else "_" for c in socket.gethostname())[:64]
    return Path.cwd() / f"nodeagent-support-{host or 'node'}-{stamp}.tar.gz"


def cmd_support_dump(config: Config, args: argparse.Namespace) -> int:
    from nodeagent.adapters.support_archive import Member, write_archive  # noqa: PLC0415
    from nodeagent.errors import HostFileError  # noqa: PLC0415

    logs.configure(config.log.level)
    dump = collect(config, args.max_bytes)
    members = [Member(n, d) for n, d, _ in dump.members]

    def write(target: Path) -> int:
        size = write_archive(target, members)
        if size > dump.cap:  # the shares make it impossible; never hand over an over-cap one
            target.unlink()
            raise HostFileError(f"{target} came out at {size} bytes, over the cap {dump.cap}")
        return size

    if args.to_stick:
        target, size = to_stick(config, default_output().name, write)
    else:
        target = (args.output or default_output()).absolute()
        size = write(target)
    if args.json:
        output.print_json("support-dump", {
            "path": str(target), "sizeBytes": size, "capBytes": dump.cap,
            "members": [{"name": n, "sizeBytes": len(d), "truncated": c}
                        for n, d, c in dump.members],
            "problems": dump.problems,
        })  # fmt: skip
        return 0
    print(f"wrote {target} ({format_bytes(size)} of its {format_bytes(dump.cap)} cap, mode 0600)")
    if args.to_stick:
        print("the stick is unmounted: it may be pulled out")
    for name, data, cut in dump.members:
        print(f"  {name}: {format_bytes(len(data))}{' (cut to its share)' if cut else ''}")
    for p in dump.problems:
        output.print_error(p["reason"], f"{p['member']}: {p['message']}", prefix="warning")
    sys.stdout.flush()
    return 0
