"""Logging setup: structlog events, one line each, readable in ``journalctl -u nodeagent``.

A line reads ``image_pulled: image=quay.io/a@sha256:... seconds=12.3``: the
event (past-tense snake_case) then its fields. An event with a catalog entry
(``journal.SUMMARIES``: every warning and error) leads with its summary, a sentence
for a reader who knows no Python: ``A sync could not run. sync_failed: reason=...``;
the ``event: fields`` part stays the same, so a search for it still finds the line.
Under systemd each line starts with a ``<N>`` syslog priority, which journald
turns into the entry's priority (so ``journalctl -p err -u nodeagent`` shows only
failures) and strips from the text; journald adds timestamp and unit, so none is
printed. Secrets never reach a log call: credentials are objects whose repr hides
them.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import structlog

from nodeagent.journal import SUMMARIES, entry_fields, serialize, summary

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_SYSLOG_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}


def _value(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\n'):
        return text
    return json.dumps(text, ensure_ascii=False)


def render_line(
    event_dict: MutableMapping[str, Any], *, with_priority: bool, with_level: bool = True
) -> str:
    """``[<N>][Summary. ]event: key=value ...`` with values quoted only when they need it.

    Without a priority prefix, warnings and errors start with their level (``WARNING``),
    unless ``with_level`` is False: a journal entry carries it as PRIORITY.
    """
    level = str(event_dict.pop("level", "info"))
    event = str(event_dict.pop("event", ""))
    fields = " ".join(f"{key}={_value(val)}" for key, val in event_dict.items())
    prefix = f"<{_SYSLOG_PRIORITY.get(level, 6)}>" if with_priority else ""
    if level in ("warning", "error", "critical") and not with_priority and with_level:
        prefix = f"{level.upper()} "
    sentence = summary(event)
    if sentence is not None:
        prefix += f"{sentence} "
    return f"{prefix}{event}: {fields}" if fields else f"{prefix}{event}"


_LEAD = re.compile(r"^(?:<\d>|(?:WARNING|ERROR|CRITICAL) )")
_EVENT = re.compile(r"^([a-z][a-z0-9_]*)(?::|$)")


def event_of(line: str) -> str | None:
    """The event of a rendered line (``render_line``), its sentence and level skipped; None
    when the line is not one of ours. For the tests and benchmarks that read output."""
    text = _LEAD.sub("", line)
    bare = _EVENT.match(text)
    if bare is not None:
        return bare[1]
    for event, sentence in SUMMARIES.items():
        head = f"{sentence}. {event}"
        if text.startswith(head) and text[len(head) : len(head) + 1] in ("", ":"):
            return event
    return None


JournalSend = Callable[[bytes], bool]
"""Sends one serialized journal entry; False when journald did not take it."""


class _LineLogger:
    """Writes each rendered line to a stream; an empty line means the journal took the event."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def msg(self, message: str) -> None:
        if message:
            self._stream.write(message + "\n")
            self._stream.flush()

    debug = info = warning = error = critical = exception = log = msg


def configure(
    level: str = "info",
    stream: TextIO | None = None,
    *,
    with_priority: bool = False,
    journal: JournalSend | None = None,
) -> None:
    """Route structlog events to journald (``journal``) with fields, or to ``stream`` as lines."""

    def renderer(_logger: object, _name: str, event_dict: MutableMapping[str, Any]) -> str:
        if journal is not None:
            fields = dict(event_dict)
            event, level_name = str(fields.get("event", "")), str(fields.get("level", "info"))
            text = render_line(dict(event_dict), with_priority=False, with_level=False)
            if journal(serialize(entry_fields(event, level_name, text, fields))):
                return ""
        return render_line(event_dict, with_priority=with_priority)

    out = stream or sys.stderr
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=lambda *_args: _LineLogger(out),
        cache_logger_on_first_use=False,
    )
