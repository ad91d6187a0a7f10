"""The ``nodeagent`` command line.

Every failure prints ``error: <Reason>: <what happened>; what to do: <…>`` on
stderr (``cli.output``) and exits with that error's ``exit_code`` (see
``nodeagent.errors``); ``--json`` output is a versioned document for scripts
(docs/cli.md). The global options go before or after any command
(``cli.options``); ``--root`` puts every host path under a prefix (tests, chroots).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from nodeagent import logs
from nodeagent.adapters.crio_config import CrioDropins
from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.host import read_boot_id
from nodeagent.adapters.journald import JournalSink
from nodeagent.adapters.pins_lock import PINS_LOCK_NAME, PinsLock
from nodeagent.adapters.systemd import RuntimeReloader
from nodeagent.cli import options, output
from nodeagent.config import Config, load_config
from nodeagent.errors import HostFileError, NodeAgentError, SpecInvalid
from nodeagent.ledger import LedgerStore
from nodeagent.pins import foreign_pins, render_dropin
from nodeagent.ports import StoredImage
from nodeagent.specs import load_spec_dirs
from nodeagent.strict import clip

MODULE_COMMANDS = (
    "bundle",
    "store",
    "site",
    "completion",
    "mirror_dropin",
    "lifecycle",
    "support_dump",
)
"""Commands of their own module (``nodeagent.cli.<command>``), loaded only when a command
line other than ``run`` is parsed: the daemon never loads them (0.7 MiB of its idle
memory, docs/performance.md)."""


MODULE_OF = {
    "render-mirror-dropin": "mirror_dropin",
    "unpin": "lifecycle",
    "support-dump": "support_dump",
}
"""Commands whose module is not named after them."""

DAEMON_COMMANDS = ("run", "serve-peers", "serve-mirror", "serve-session")
INTERNAL_ERROR_EXIT = 70
"""EX_SOFTWARE: a defect in nodeagent, said in one ``error: InternalError`` line."""
"""The commands systemd runs for the lifetime of a unit: parsed without the others'."""


def _command_of(argv: Sequence[str] | None) -> str | None:
    """The command word of a command line, found without the full parser."""
    known, _rest = options.early_parser().parse_known_args(argv)
    return str(known.command) if known.command else None


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage error is one ``error: UsageInvalid: …`` line (decision 0073);
    its subcommands' parsers are of this class too (argparse's ``parser_class``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, output.error_line("UsageInvalid", f"{self.prog}: {message}") + "\n")


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; for ``run``, without the other commands' modules. Every
    global option is accepted before and after every command (``cli.options``)."""
    parser: argparse.ArgumentParser = OneLineParser(
        prog="nodeagent", description="Pin and pre-load container images on a CRI-O node."
    )
    options.add_global_options(parser, is_top=True)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the daemon (systemd starts it)")
    serve = sub.add_parser(
        "serve-peers",
        help="serve the store to the site's peers, unprivileged (nodeagent-peer.service starts it)",
    )
    serve.add_argument(
        "--check",
        action="store_true",
        help="only say whether [site] serve is on: exit 0 if so, 1 if not (the unit's "
        "ExecCondition=)",
    )
    mirror = sub.add_parser(
        "serve-mirror",
        help="serve the node mirror to local clients, unprivileged (nodeagent-mirror.socket "
        "starts it on the first connection)",
    )
    mirror.add_argument(
        "--check",
        action="store_true",
        help="only say whether [mirror] enabled is on: exit 0 if so, 1 if not",
    )
    # One mirror session's loopback server (decision 0064): started by the daemon or by
    # nodeagent-session.socket, never by hand; its standard input is a unix socket.
    sub.add_parser(
        "serve-session",
        help="serve one import's or restore's blobs on loopback (the daemon or "
        "nodeagent-session.socket starts it; never by hand)",
    )
    if command not in DAEMON_COMMANDS:
        _add_commands(sub)
    options.add_everywhere(parser)
    return parser


def _add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    status = sub.add_parser("status", help="what nodeagent did: sets, images, disk, work, bundles")
    status.add_argument(
        "--watch",
        action="store_true",
        help="read it again every second: redrawn in place on a terminal, each change printed "
        "in a pipe (Ctrl-C ends it)",
    )
    sub.add_parser("runtime", help="show the runtime, its image filesystem and images")
    sub.add_parser(
        "check-offline", help="what would break here if the registry vanished now (docs/offline.md)"
    )
    pull = sub.add_parser("pull", help="pull images through the runtime (by digest)")
    pull.add_argument("images", nargs="+", metavar="IMAGE")
    for name in MODULE_COMMANDS:
        importlib.import_module(f"nodeagent.cli.{name}").add_parser(sub)


# ---------------------------------------------------------------- commands
def cmd_run(config: Config, _args: argparse.Namespace) -> int:
    sink = JournalSink() if JournalSink.is_wanted() else None
    logs.configure(
        config.log.level,
        with_priority="JOURNAL_STREAM" in os.environ,
        journal=sink.send if sink else None,
    )
    from nodeagent.daemon import root as daemon  # noqa: PLC0415  (not for serve-peers)

    return asyncio.run(daemon.run(config))


def cmd_check_config(config: Config, args: argparse.Namespace) -> int:
    """The configuration (a bad one never gets here: ConfigInvalid, 78), the files it names
    (trusted keys, the kubeconfig in cluster mode, the site's certificates: 78 when one is
    missing or does not load, ``adapters.config_files``) and every set file (65 when one is
    refused)."""
    from nodeagent.adapters.config_files import check_referenced_files  # noqa: PLC0415
    from nodeagent.adapters.fips import read_posture  # noqa: PLC0415
    from nodeagent.fips import posture_line, refusal_message  # noqa: PLC0415

    load = load_spec_dirs(config.spec_dirs())
    files = [str(f) for f in config.files]
    referenced = check_referenced_files(config)
    crypto = read_posture(always_probe=True, path=config.bundles.fips_switch)
    if args.json:
        output.print_json("check-config", {
            "configFiles": files,
            "configDefaults": not files,
            "trustedKeys": referenced.trusted_keys,
            "notes": list(referenced.notes),
            "crypto": crypto.to_json(),
            "referencedFiles": [
                {"reason": f.reason, "message": f.message, "whatToDo": output.hint_for(f.reason)}
                for f in referenced.problems
            ],
            "sessionServer": (
                "child" if config.bundles.session_socket is None
                else str(config.bundles.session_socket)
            ),
            "sets": [
                {"name": s.name, "images": len(s.images), "persistent": s.is_persistent,
                 "source": s.source}
                for s in load.sets
            ],
            "problems": [
                {"file": p.source, "set": p.object_name, "reason": p.reason, "message": p.text(),
                 "whatToDo": output.hint_for(p.reason)}
                for p in load.problems
            ],
        })  # fmt: skip
    else:
        shown = ", ".join(files) or f"{config.source} (defaults: file absent)"
        verdict = "ok" if not referenced.problems else "NOT usable as it is"
        print(f"config: {verdict} ({shown})")
        keys = referenced.trusted_keys
        if keys is not None:
            print(f"trusted keys: {keys} in {config.bundles.trusted_keys_dir}")
        for note in referenced.notes:
            print(f"note: {note}")
        print(posture_line(crypto))
        if crypto.reason is not None:
            output.print_error(crypto.reason, refusal_message(crypto), prefix="warning")
        for found in referenced.problems:
            output.print_error(found.reason, found.message)
        if config.bundles.session_socket is None:
            print(
                '[bundles] session_socket = "": an import\'s loopback server runs as the '
                "daemon's own user (root under systemd), not the unprivileged "
                "nodeagent-session.socket: for development and tests only (decision 0064)"
            )
        for s in load.sets:
            kind = "persistent" if s.is_persistent else "transient"
            print(clip(f"set {s.name}: ok, {len(s.images)} images, {kind}, from {s.source}"))
        for problem in load.problems:
            output.print_error(problem.reason, problem.text())
    if referenced.problems:
        return max(f.exit_code for f in referenced.problems)
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
        text = _render(config, dropins)
        if args.json:
            output.print_json("render-pins", {"action": "printed", "dropin": text})
        else:
            print(text, end="")
        return 0
    done = _write_pins(config, dropins, is_reloading=args.reload)
    if args.json:
        output.print_json("render-pins", done)
    elif done["action"] == "skipped":
        print(
            f"skipped: process {done['lockHolder']} holds {done['lock']}: the nodeagent daemon, "
            "which renders the pins itself, or another render-pins"
        )
    else:
        print(f"{done['action']}: {dropins.target} (linked from {dropins.link})")
        if done.get("reloaded"):
            print(f"reloaded {config.runtime.unit} ({done['reloaded']})")
    return 0


def _write_pins(config: Config, dropins: CrioDropins, *, is_reloading: bool) -> dict[str, Any]:
    """``render-pins --write``: what it did (the ``--json`` document's body)."""
    lock = PinsLock(config.state.run_dir / PINS_LOCK_NAME)
    if not lock.try_acquire():
        return {"action": "skipped", "lock": str(lock.path), "lockHolder": lock.holder()}
    try:
        is_changed = False
        for _ in range(MAX_RENDER_ROUNDS):  # a file changed while this one was written
            if not dropins.write_dropin(_render(config, dropins)):
                break
            is_changed = True
        done: dict[str, Any] = {
            "action": "wrote" if is_changed else "unchanged",
            "target": str(dropins.target),
            "link": str(dropins.link),
            "reloaded": None,
        }
        if is_changed and is_reloading:
            rt = config.runtime
            reloader = RuntimeReloader(rt.unit, pid_file=rt.pid_file, timeout_s=rt.reload_timeout_s)
            done["reloaded"] = str(asyncio.run(reloader.reload()))
        return done
    finally:
        lock.release()


MAX_RENDER_ROUNDS = 3
"""Renders per ``render-pins --write``: again while the last one still changed the file."""


def _render(config: Config, dropins: CrioDropins) -> str:
    store = LedgerStore(JsonStateStore(config.state.dir), read_boot_id())
    remembered = store.load(is_repairing=False).remembered_pins()
    foreign = foreign_pins(dropins.read_other_configs())
    for problem in foreign.problems:  # CRI-O will refuse to start until it is fixed
        output.print_error("RuntimeConfigInvalid", problem.message, prefix="warning")
    return render_dropin([*remembered, *foreign.patterns])


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    from nodeagent.cli import status_view  # noqa: PLC0415  (not loaded by the daemon)

    return status_view.cmd_status(config, args)


def _image_row(image: StoredImage) -> str:
    name = (image.repo_digests or image.repo_tags or (image.id,))[0]
    pin = "pinned" if image.is_pinned else "-"
    return f"{pin:<7} {image.size_bytes / 1e6:>9.1f} MB  {clip(name, 500)}"


async def _runtime(endpoint: str, as_json: bool) -> int:
    from nodeagent.adapters.cri.client import CriClient  # noqa: PLC0415  (not for serve-peers)

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
        output.print_json("runtime", doc)
        return 0
    print(
        f"runtime: {version.runtime_name} {version.runtime_version} "
        f"(CRI {version.runtime_api_version})"
    )
    for fs in filesystems:
        print(f"image filesystem: {clip(fs.mountpoint, 500)}")
    pinned = sum(1 for i in images if i.is_pinned)
    print(f"images: {len(images)} stored, {pinned} pinned")
    for image in images:
        print("  " + _image_row(image))
    return 0


def cmd_runtime(config: Config, args: argparse.Namespace) -> int:
    return asyncio.run(_runtime(config.runtime.endpoint, args.json))


async def _pull(endpoint: str, refs: Sequence[str], *, as_json: bool) -> int:
    pulled: list[dict[str, str]] = []
    from nodeagent.adapters.cri.client import CriClient  # noqa: PLC0415  (not for serve-peers)

    async with CriClient(endpoint) as cri:
        for ref in refs:
            image_ref = await cri.pull_image(ref, timeout_s=3600)
            pulled.append({"image": ref, "imageRef": image_ref})
            if not as_json:
                print(clip(f"pulled {ref} -> {image_ref}", 1000))
    if as_json:
        output.print_json("pull", {"pulled": pulled})
    return 0


def cmd_pull(config: Config, args: argparse.Namespace) -> int:
    return asyncio.run(_pull(config.runtime.endpoint, args.images, as_json=args.json))


def _configure_server_logs(config: Config) -> None:
    sink = JournalSink() if JournalSink.is_wanted() else None
    logs.configure(
        config.log.level,
        with_priority="JOURNAL_STREAM" in os.environ,
        journal=sink.send if sink else None,
    )


def cmd_serve_peers(config: Config, args: argparse.Namespace) -> int:
    """The peer server in its own unprivileged process (decision 0056)."""
    if args.check:
        serve = config.site.serve
        print(f"[site] serve = {'true' if serve else 'false'} ({config.source})")
        return 0 if serve else 1
    from nodeagent.daemon import site  # noqa: PLC0415  (aiohttp: the peer process only)

    _configure_server_logs(config)
    return asyncio.run(site.serve(config))


def cmd_serve_mirror(config: Config, args: argparse.Namespace) -> int:
    """The node mirror in its own unprivileged, socket-activated process (decision 0063)."""
    if args.check:
        enabled = config.mirror.enabled
        print(f"[mirror] enabled = {'true' if enabled else 'false'} ({config.source})")
        return 0 if enabled else 1
    from nodeagent.daemon import mirror_process  # noqa: PLC0415  (aiohttp: that process only)

    _configure_server_logs(config)
    return asyncio.run(mirror_process.serve_mirror(config))


def cmd_serve_session(config: Config, _args: argparse.Namespace) -> int:
    """One mirror session's loopback server in its own process (decision 0064)."""
    from nodeagent.daemon import session  # noqa: PLC0415  (aiohttp: the session process only)

    sink = JournalSink() if JournalSink.is_wanted() else None
    logs.configure(
        config.log.level,
        with_priority="JOURNAL_STREAM" in os.environ,
        journal=sink.send if sink else None,
    )
    return asyncio.run(session.serve_session())


def cmd_check_offline(config: Config, args: argparse.Namespace) -> int:
    from nodeagent.cli import offline  # noqa: PLC0415  (not loaded by the daemon)

    return offline.cmd_check_offline(config, args.json)


COMMANDS = {
    "run": cmd_run,
    "serve-peers": cmd_serve_peers,
    "serve-mirror": cmd_serve_mirror,
    "serve-session": cmd_serve_session,
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
    module = importlib.import_module(f"nodeagent.cli.{MODULE_OF.get(name, name)}")
    attribute = f"cmd_{name.replace('-', '_')}"
    function: Callable[[Config, argparse.Namespace], int] = getattr(module, attribute)
    return function


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser(_command_of(argv)).parse_args(argv)
    try:
        config = load_config(args.config, root=args.root)
        return _command(args.command)(config, args)
    except NodeAgentError as exc:
        output.print_error(exc.reason, exc.message)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # a file or device the command met, not one a layer wrapped
        if args.command in DAEMON_COMMANDS:
            raise
        output.print_error(HostFileError.reason, f"{exc.filename or ''}: {exc.strerror or exc}")
        return HostFileError.exit_code
    except Exception as exc:  # a defect: one line, never a traceback, for a person
        if args.command in DAEMON_COMMANDS:
            raise  # the daemon's crash is the journal's (and systemd's) to record whole
        output.print_error("InternalError", f"{type(exc).__name__}: {exc}")
        return INTERNAL_ERROR_EXIT


if __name__ == "__main__":
    sys.exit(main())
