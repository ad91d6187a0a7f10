"""Every warning and error nodeagent logs is explained in the journal catalog (issue 28).

A static walk of ``nodeagent/`` finds every ``log.warning``, ``log.error``, ``log.critical``
and ``log.exception`` call; each event it names has a MESSAGE_ID (``journal.MESSAGE_IDS``)
and so an entry in ``systemd/nodeagent.catalog`` that ``journalctl -x`` shows. A call whose
event or level is not written out (``getattr(log, level)``, ``log.warning(event)``) must be
listed in ``DYNAMIC`` with the events it can log, so a new one is seen the day it is written.
The other way round, an entry names an event that the code still emits.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import io
import re
from pathlib import Path

import pytest
import structlog

import nodeagent
from nodeagent import journal, logs
from nodeagent.status import BundleReport, bundle_line

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(nodeagent.__file__).resolve().parent
"""The package under test: the source tree, or the installed copy in the RPM's %check."""
CATALOG = ROOT / "systemd" / "nodeagent.catalog"
LOUD = frozenset({"warning", "error", "critical", "exception"})
LEVELS = LOUD | {"info", "debug"}

DYNAMIC = {
    # Importer._report: error when the report is a rejection, info for every other step
    "bundles/importer.py": {"bundle_rejected"},
    # log_pull: a PullStep's value; only FAILED is logged at error
    "reporting.py": {"pull_failed"},
    # BundleFetcher._refused(event=...)
    "site/fetcher.py": {"bundle_fetch_refused", "bundle_fetch_failed"},
}
"""Module (under nodeagent/) -> the warning-or-worse events its computed log calls emit."""


def _is_log_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in LEVELS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "log"
    )


def _is_computed_level(node: ast.AST) -> bool:
    """``getattr(log, level)(...)``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Call)
        and isinstance(node.func.func, ast.Name)
        and node.func.func.id == "getattr"
        and bool(node.func.args)
        and isinstance(node.func.args[0], ast.Name)
        and node.func.args[0].id == "log"
    )


def scan(source: str | ast.Module) -> tuple[set[str], set[str], int]:
    """(events logged at warning or worse, events logged at any level, computed calls)."""
    loud: set[str] = set()
    every: set[str] = set()
    computed = 0
    tree = ast.parse(source) if isinstance(source, str) else source
    for node in ast.walk(tree):
        if _is_computed_level(node):
            computed += 1
        if not _is_log_call(node):
            continue
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        first = node.args[0] if node.args else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            every.add(first.value)
            if node.func.attr in LOUD:
                loud.add(first.value)
        elif node.func.attr in LOUD:
            computed += 1
    return loud, every, computed


@dataclasses.dataclass(frozen=True)
class Module:
    loud: set[str]
    computed: int
    constants: set[str]


@functools.cache
def modules() -> dict[str, Module]:
    """Each module of the package (path under nodeagent/), parsed and walked once."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        loud, _every, computed = scan(tree)
        constants = {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
        found[str(path.relative_to(PACKAGE))] = Module(loud, computed, constants)
    return found


def catalog_subjects() -> dict[str, str]:
    text = CATALOG.read_text()
    return dict(re.findall(r"^-- ([0-9a-f]{32})\nSubject: (.*)$", text, re.M))


def test_every_warning_and_error_event_has_a_catalog_entry() -> None:
    missing, unlisted = [], []
    for name, module in modules().items():
        loud = module.loud | DYNAMIC.get(name, set())
        if module.computed and name not in DYNAMIC:
            unlisted.append(name)
        missing += [f"{name}: {event}" for event in sorted(loud - set(journal.MESSAGE_IDS))]
    assert unlisted == [], f"computed log calls, list their events in DYNAMIC: {unlisted}"
    assert missing == [], "no catalog entry (systemd/nodeagent.catalog):\n" + "\n".join(missing)


def test_the_dynamic_events_are_still_named_in_their_modules() -> None:
    found = modules()
    constants = set().union(*(m.constants for m in found.values()))
    for name, events in DYNAMIC.items():
        assert found[name].computed > 0, f"{name} has no computed log call any more"
        assert events <= constants, f"{name}: {sorted(events - constants)} not in the code"


def test_every_catalogued_event_is_still_emitted() -> None:
    # An event name that appears only as a whole string literal: renamed events fail here.
    others = [m for name, m in modules().items() if name != "journal.py"]
    constants = set().union(*(m.constants for m in others))
    assert sorted(set(journal.MESSAGE_IDS) - constants) == []


def test_each_summary_is_its_catalog_subject_word_for_word() -> None:
    subjects = catalog_subjects()
    assert set(journal.SUMMARIES) == set(journal.MESSAGE_IDS)
    for event, summary in journal.SUMMARIES.items():
        assert subjects[journal.MESSAGE_IDS[event]] == summary, event
        assert not summary.endswith((".", ":")), event  # the line adds the full stop


def test_catalog_entries_say_what_happened_and_what_to_do_in_plain_words() -> None:
    text = CATALOG.read_text()
    for block in re.split(r"(?m)^(?=-- [0-9a-f]{32}$)", text)[1:]:
        header, _, body = block.partition("\n\n")
        assert "Defined-By: nodeagent" in header, header
        words = body.split()
        assert len(words) >= 15, header  # more than the subject again
        # No Python a technician cannot act on
        for term in ("Traceback", "Exception", "NodeAgentError", "self._", "()", "asyncio"):
            assert term not in body, (header, term)


@pytest.mark.parametrize(
    ("level", "event", "fields", "expected"),
    [
        (
            "error",
            "sync_failed",
            {"reason": "SpecInvalid"},
            "ERROR A sync could not run. sync_failed: reason=SpecInvalid",
        ),
        (
            "info",
            "bundle_stored",
            {"bundle": "line-3", "bytes": "8 MiB"},
            "The bundle is in the node's store: the medium may be removed. "
            'bundle_stored: bundle=line-3 bytes="8 MiB"',
        ),
        ("info", "bundle_fetched", {"bundle": "x"}, "bundle_fetched: bundle=x"),
    ],
)
def test_a_catalogued_line_leads_with_its_sentence_and_keeps_event_and_fields(
    level: str, event: str, fields: dict[str, object], expected: str
) -> None:
    line = logs.render_line({"event": event, "level": level, **fields}, with_priority=False)
    assert line == expected


def test_the_journal_message_leads_with_the_sentence_too() -> None:
    sent: list[bytes] = []

    def send(payload: bytes) -> bool:
        sent.append(payload)
        return True

    logs.configure("info", io.StringIO(), journal=send)
    try:
        structlog.get_logger("t").error("media_watch_failed", error="netlink closed")
    finally:
        structlog.reset_defaults()
    assert (
        b"MESSAGE=nodeagent stopped seeing plugged-in sticks. "
        b'media_watch_failed: error="netlink closed"\n'
    ) in sent[0]
    assert b"MESSAGE_ID=" + journal.MESSAGE_IDS["media_watch_failed"].encode() in sent[0]


@pytest.mark.parametrize(
    ("source", "loud", "computed"),
    [
        ('log.warning("a_failed", x=1)\n', {"a_failed"}, 0),
        ('log.info("a_done")\n', set(), 0),
        ('log.exception("b_failed")\n', {"b_failed"}, 0),
        ("log.error(event, x=1)\n", set(), 1),
        ('getattr(log, level)("c_done")\n', set(), 1),
        ('job.exception("not_a_log")\n', set(), 0),
    ],
)
def test_the_scan_finds_loud_and_computed_calls(source: str, loud: set[str], computed: int) -> None:
    found, _every, count = scan(source)
    assert (found, count) == (loud, computed)


@pytest.mark.parametrize(
    ("line", "event"),
    [
        ("image_pulled: image=a seconds=1", "image_pulled"),
        ("daemon_started", "daemon_started"),
        ("<6>The upgrade bundle is authentic. bundle_verified: bundle=x", "bundle_verified"),
        (
            "The bundle is in the node's store: the medium may be removed. bundle_stored: bundle=x",
            "bundle_stored",
        ),
        ("ERROR A sync could not run. sync_failed: reason=SpecInvalid", "sync_failed"),
        (
            "WARNING udev is not running: plugged-in sticks are not seen. udev_not_running",
            "udev_not_running",
        ),
        ("WARNING udev is not running: plugged-in sticks are not seen.", None),
        ("==> Debian packages", None),
    ],
)
def test_event_of_finds_the_event_behind_its_sentence(line: str, event: str | None) -> None:
    assert logs.event_of(line) == event


def test_one_safe_to_remove_moment_in_the_same_words_everywhere() -> None:
    # bundle_stored: the store holds the whole bundle and the importer released the medium
    words = "the medium may be removed"
    subject = catalog_subjects()[journal.MESSAGE_IDS["bundle_stored"]]
    assert subject.endswith(f": {words}")
    stored = BundleReport("/dev/sdb1", "stored", bundle_id="line-3", is_medium_removable=True)
    assert bundle_line(stored) == f"bundle line-3 stored: {words}"  # systemd's STATUS=
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert f"`{subject}. bundle_stored: ...`" in operations
    detected = CATALOG.read_text().split(journal.MESSAGE_IDS["bundle_media_detected"])[1]
    assert f'"{words}" (bundle_stored)' in " ".join(detected.split("\n-- ")[0].split())
