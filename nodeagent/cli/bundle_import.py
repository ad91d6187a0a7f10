"""``nodeagent bundle import PATH``: the daemon's import, by hand, then one sync to pin the sets.

For a bundle on a medium that is already mounted (or copied to disk). Prints each step as
the journal would show it and exits 0 when the bundle is imported (or already was), 65 when
it is refused, 75 when the import was interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

from nodeagent import logs
from nodeagent.bundles.imports import build_importer
from nodeagent.cli.bundle import BUNDLE_COMMANDS, Subparsers
from nodeagent.config import Config
from nodeagent.daemon import root as daemon
from nodeagent.status import status_line

if TYPE_CHECKING:
    from nodeagent.bundles.importer import BundleReport

EXIT_REFUSED = 65
EXIT_INTERRUPTED = 75


def add_import_parser(commands: Subparsers) -> None:
    parser = commands.add_parser("import", help="import a bundle directory now and pin its sets")
    parser.add_argument("path", type=Path, help="the bundle's directory (a mounted medium)")
    parser.add_argument("--json", action="store_true", help="print the final report as JSON")
    BUNDLE_COMMANDS["import"] = cmd_import


def cmd_import(config: Config, args: argparse.Namespace) -> int:
    logs.configure(config.log.level)
    report = asyncio.run(_import(config, args.path.resolve()))
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    if report.state == "imported":
        return 0
    return EXIT_INTERRUPTED if report.state == "interrupted" else EXIT_REFUSED


async def _import(config: Config, root: Path) -> BundleReport:
    wiring = daemon.build(config)
    try:
        importer = build_importer(
            config, wiring.cri, wiring.reconciler.pins.reloader, on_report=lambda _r: None
        )
        report = await importer.import_bundle(root, source=str(root))
        if report.state == "imported":
            status = await wiring.reconciler.sync()
            daemon.publish(wiring, status)
            print(f"sync: {status_line(status)}")
        return report
    finally:
        await wiring.cri.close()
