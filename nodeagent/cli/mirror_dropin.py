"""``nodeagent render-mirror-dropin``: the node mirror's registries.conf drop-in.

Without ``--write`` it prints the text it would write (or says why it would not); with it,
it writes the file (only changed bytes), and with ``--reload`` reloads CRI-O once when the
file changed. nodeagent-mirror-dropin.path runs it when registries.conf or a drop-in
changes, whether the daemon runs or not (docs/mirror.md). ``[mirror] enabled = false``: the
file is removed. Exit 78 (``RegistriesConfInvalid``) when another registries.conf file is
malformed or the merge would be refused; nothing is written then.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from nodeagent import logs
from nodeagent.adapters.bundles.node_mirror_dropin import held_repositories
from nodeagent.adapters.systemd import RuntimeReloader
from nodeagent.cli import output
from nodeagent.config import Config
from nodeagent.daemon.mirror_dropin import node_mirror_dropin, sync_once
from nodeagent.errors import RegistriesConfInvalid


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    render = sub.add_parser(
        "render-mirror-dropin",
        help="print (or write) the node mirror's registries.conf drop-in (docs/mirror.md)",
    )
    render.add_argument("--write", action="store_true", help="write or remove the file")
    render.add_argument(
        "--reload", action="store_true", help="with --write: reload CRI-O when the file changed"
    )


def cmd_render_mirror_dropin(config: Config, args: argparse.Namespace) -> int:
    logs.configure(config.log.level)
    if not args.write:
        return _print(config, as_json=args.json)
    outcome = sync_once(config)
    done: dict[str, Any] = {
        "action": outcome.action,
        "file": str(outcome.path),
        "repositories": outcome.repositories,
        "blockedSources": list(outcome.blocked),
        "reloaded": None,
    }
    if outcome.action == "refused":
        output.print_error(outcome.reason, outcome.message)
        return RegistriesConfInvalid.exit_code
    if outcome.action in ("wrote", "removed") and args.reload:
        rt = config.runtime
        reloader = RuntimeReloader(rt.unit, pid_file=rt.pid_file, timeout_s=rt.reload_timeout_s)
        done["reloaded"] = str(asyncio.run(reloader.reload()))
    if args.json:
        output.print_json("render-mirror-dropin", done)
        return 0
    print(f"{outcome.action}: {outcome.path} ({outcome.repositories} repositories)")
    for repository in outcome.blocked:
        print(f"no fallback: the source of {repository} is blocked; only its mirrors serve it")
    if done["reloaded"]:
        print(f"reloaded {config.runtime.unit} ({done['reloaded']})")
    return 0


def _print(config: Config, *, as_json: bool) -> int:
    dropin = node_mirror_dropin(config)
    held = held_repositories(config.store_dir) if config.mirror.enabled else None
    text = dropin.render(held, dropin.existing()) if held and held.repositories else ""
    if as_json:
        output.print_json("render-mirror-dropin", {"action": "printed", "dropin": text})
    else:
        print(text, end="")
    return 0
