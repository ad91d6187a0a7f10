"""journald entries: fields, MESSAGE_IDs and the native protocol's framing."""

from __future__ import annotations

import io
import re
import struct
from collections.abc import Callable
from pathlib import Path

import structlog

from nodeagent import journal, logs

CATALOG = Path(__file__).resolve().parents[2] / "systemd" / "nodeagent.catalog"


def test_entry_fields_carry_message_id_and_filterable_fields() -> None:
    entry = journal.entry_fields(
        "disk_refused", "error", "disk_refused: sets=[a]",
        {"set": "line-3", "reason": "InsufficientDiskSpace", "image": "", "other": 1},
    )  # fmt: skip
    assert entry == [
        ("MESSAGE", "disk_refused: sets=[a]"),
        ("PRIORITY", "3"),
        ("SYSLOG_IDENTIFIER", "nodeagent"),
        ("NODEAGENT_EVENT", "disk_refused"),
        ("MESSAGE_ID", journal.MESSAGE_IDS["disk_refused"]),
        ("NODEAGENT_SET", "line-3"),
        ("NODEAGENT_REASON", "InsufficientDiskSpace"),
    ]


def test_serialize_frames_multiline_values_with_their_length() -> None:
    data = journal.serialize([("MESSAGE", "two\nlines"), ("PRIORITY", "6")])
    assert data == b"MESSAGE\n" + struct.pack("<Q", 9) + b"two\nlines\n" + b"PRIORITY=6\n"


def test_message_ids_are_unique_128_bit_hex_and_each_has_a_catalog_entry() -> None:
    ids = list(journal.MESSAGE_IDS.values())
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    catalog = CATALOG.read_text()
    headers = re.findall(r"^-- ([0-9a-f]{32})$", catalog, re.M)
    assert sorted(headers) == sorted(ids)


def test_every_event_with_a_message_id_is_logged_somewhere() -> None:
    # A renamed event would silently lose its catalog text.
    # The package as imported: the source tree, or the RPM's build root in its %check
    package = Path(journal.__file__).parent
    sources = "".join(
        path.read_text() for path in package.rglob("*.py") if path.name != "journal.py"
    )
    assert sorted(e for e in journal.MESSAGE_IDS if f'"{e}"' not in sources) == []


def recording(sent: list[bytes]) -> Callable[[bytes], bool]:
    """A journal that takes every payload and keeps it in ``sent``."""

    def send(payload: bytes) -> bool:
        sent.append(payload)
        return True

    return send


def test_events_go_to_the_journal_when_it_takes_them_else_to_the_stream() -> None:
    sent: list[bytes] = []
    out = io.StringIO()
    logs.configure("info", out, journal=recording(sent))
    try:
        structlog.get_logger("t").info("set_pinned", set="apps", images=3)
    finally:
        structlog.reset_defaults()
    assert out.getvalue() == ""
    assert b"NODEAGENT_SET=apps\n" in sent[0]
    pinned = b"The images of a PinnedImageSet are pinned. set_pinned: set=apps images=3"
    assert b"MESSAGE=" + pinned + b"\n" in sent[0]

    refused = io.StringIO()
    logs.configure("info", refused, with_priority=True, journal=lambda _payload: False)
    try:
        structlog.get_logger("t").info("set_pinned", set="apps")
    finally:
        structlog.reset_defaults()
    assert (
        refused.getvalue() == "<6>The images of a PinnedImageSet are pinned. set_pinned: set=apps\n"
    )


def test_journal_message_leaves_the_level_to_priority() -> None:
    sent: list[bytes] = []
    logs.configure("info", io.StringIO(), journal=recording(sent))
    try:
        structlog.get_logger("t").warning("sync_postponed", reason="RuntimeUnreachable")
    finally:
        structlog.reset_defaults()
    assert (
        b"MESSAGE=The container runtime does not answer. "
        b"sync_postponed: reason=RuntimeUnreachable\n"
    ) in sent[0]
    assert b"PRIORITY=4\n" in sent[0]
