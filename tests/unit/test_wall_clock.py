"""The wall clock is read only for dates (issue 30 item 5, the clock-jump drill).

A node's wall clock can be stepped (an NTP step, an administrator's ``date -s``): every
timeout, backoff, stall window and rate in ``nodeagent/`` counts monotonic seconds
(``time.monotonic``, the event loop's ``loop.time()``), which a step does not move. The wall
clock (``time.time``, ``datetime.now``, ...) is read only where the value is a date: a
bundle's ``expires``, ``created`` and acceptance time, status and report timestamps, file
names, an HTTP date, file modification times (which are wall-clock dates themselves).
Each module that reads it is listed here with what for: a new reading fails this test until
it is listed, which is the moment to ask whether it measures a duration (it must not;
``tests/faults/test_clock_jumps.py`` steps a daemon's clock to show it). The walk is of the
package itself, so a new module is covered the day it is added.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import nodeagent

PACKAGE = Path(nodeagent.__file__).resolve().parent
"""The package under test: the source tree, or the installed copy in the RPM's %check."""
TIME_READS = frozenset({"time", "time_ns", "gmtime", "localtime"})
DATE_READS = frozenset({"now", "utcnow", "today"})

DATES: dict[str, str] = {
    "adapters/bundles/writer.py": "a bundle's `created`",
    "adapters/files.py": "the time in a set-aside file's name",
    "adapters/http/client.py": "a peer's Retry-After HTTP date",
    "adapters/offline.py": "the offline report's date",
    "adapters/registry/targets.py": "a registry's Retry-After HTTP date",
    "adapters/store/copier.py": "a stored bundle's acceptance time",
    "adapters/store/fetched.py": "a fetched bundle's acceptance time",
    "adapters/store/keeper.py": "acceptance times and partial files' mtimes (dates on disk)",
    "adapters/store/offer.py": "partial files' mtimes (dates on disk)",
    "adapters/store/registry_sets.py": "a registry set's record time",
    "adapters/support_archive.py": "the archive members' mtime",
    "bundles/handover.py": "the handover's `at`",
    "bundles/import_ports.py": "a bundle's `expires` at import",
    "cli/bundle_create.py": "`created`, `--expires 30d` and the default sequence",
    "cli/site.py": "`expires` in `site status`",
    "cli/store.py": "acceptance times in `store list`",
    "cli/support_dump.py": "the dump's collection time and file name",
    "cluster/starting.py": "condition and event times",
    "cluster/tasks.py": "condition times",
    "daemon/peer_reports.py": "the peer process report's `reportedAt`",
    "metrics/recorder.py": "`last_sync_unix_s`",
    "reporting.py": "the pulls' `startedAt` (the rate counts monotonic seconds)",
    "site/transfer.py": "a bundle's `expires` before a fetch",
    "sync/passes.py": "the status file's `updatedAt`",
}
"""Module (relative to the package) -> the dates it reads the wall clock for."""


def wall_clock_reads(source: str) -> Iterator[tuple[int, str]]:
    """``time.time``, ``time.time_ns``, ``time.gmtime``, ``time.localtime`` and
    ``datetime.now`` / ``utcnow`` / ``today`` (also ``dt.datetime.now``, ``date.today``),
    called or passed as a clock: (line, what)."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id == "time" and node.attr in TIME_READS:
            yield node.lineno, f"time.{node.attr}"
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        if name in ("datetime", "date") and node.attr in DATE_READS:
            yield node.lineno, f"{name}.{node.attr}"


def modules_reading_the_wall_clock() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        reads = [f"{line}: {what}" for line, what in wall_clock_reads(path.read_text())]
        if reads:
            found[path.relative_to(PACKAGE).as_posix()] = reads
    return found


def test_the_wall_clock_is_read_only_where_a_date_is_wanted() -> None:
    found = modules_reading_the_wall_clock()
    unlisted = {module: reads for module, reads in found.items() if module not in DATES}
    assert not unlisted, (
        "the wall clock is read here: a duration must count monotonic seconds; a date, "
        f"list the module in DATES with what for: {unlisted}"
    )
    gone = sorted(set(DATES) - set(found))
    assert not gone, f"listed in DATES but reading no wall clock any more: {gone}"


def test_the_walk_finds_each_form() -> None:
    source = """
import time, datetime as dt
from datetime import date, datetime
a = time.time()
b = dt.datetime.now(dt.UTC)
c = datetime.utcnow()
d = date.today()
clock = time.time
e = time.monotonic()
f = dt.datetime.fromtimestamp(0)
"""
    found = sorted(what for _, what in wall_clock_reads(source))
    assert found == ["date.today", "datetime.now", "datetime.utcnow", "time.time", "time.time"]
