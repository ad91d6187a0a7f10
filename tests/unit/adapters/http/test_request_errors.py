"""aiohttp's reports of unreadable requests: one line per address a minute, bounded memory."""

from __future__ import annotations

import structlog.testing

from nodeagent.adapters.http import request_errors
from nodeagent.adapters.http.request_errors import RequestErrors


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_address_a_minute_with_the_error_clipped_and_no_traceback() -> None:
    clock = Clock()
    errors = RequestErrors("mirror", now=clock)
    with structlog.testing.capture_logs() as events:
        for _ in range(5):
            errors.exception(
                "Error handling request from %s", "10.0.0.9", exc_info=ValueError("x" * 900)
            )
        clock.now += request_errors.REPEAT_S
        errors.exception("Error handling request from %s", "10.0.0.9", exc_info=KeyError("k"))
    assert [(e["address"], e["error"]) for e in events] == [
        ("10.0.0.9", "ValueError"),
        ("10.0.0.9", "KeyError"),
    ]
    assert "x" * 201 not in events[0]["detail"]  # clipped, and says so
    assert "more characters" in events[0]["detail"]
    assert "exc_info" not in events[0]
    assert errors.suppressed == 4


def test_an_address_is_clipped_and_the_memory_of_addresses_is_bounded() -> None:
    errors = RequestErrors("peer")
    with structlog.testing.capture_logs() as events:
        for n in range(request_errors.MAX_ADDRESSES + 500):
            errors.exception(
                "Error handling request from %s", f"10.{n >> 16}.{n >> 8 & 255}.{n & 255}"
            )
        errors.exception("Error handling request from %s", "\x1b[2J" + "a" * 500)
    assert len(errors._last) == request_errors.MAX_ADDRESSES
    assert len(events) == request_errors.MAX_ADDRESSES + 501
    assert "\x1b" not in events[-1]["address"]
    assert "a" * 65 not in events[-1]["address"]


def test_aiohttp_debug_lines_are_dropped() -> None:
    with structlog.testing.capture_logs() as events:
        RequestErrors("mirror").debug("Error handling request from %s", "127.0.0.1")
    assert events == []
