"""What aiohttp reports about a request it could not parse or answer, as one journal line.

aiohttp's server hands such a request (a header line over ``MAX_LINE_BYTES``, too many
header fields, a malformed request line, a handler that raised) to its logger's
``exception``: with no logging configured, Python's last-resort handler printed
"Error handling request" and a whole traceback to stderr, so to the journal, once per
request, for anyone who can connect. ``RequestErrors`` is that logger for the one server
(``nodeagent.adapters.http.listener``): one ``http_request_failed`` line per listener and
client address at most once a minute, the error's type and clipped text, never a
traceback. aiohttp's own debug lines are dropped.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

import structlog

from nodeagent.strict import clip

log = structlog.get_logger(__name__)

REPEAT_S: Final = 60.0
"""One line per listener and client address at most this often."""
MAX_ADDRESSES: Final = 1024
"""Addresses remembered; the oldest is forgotten first (a flood from many addresses costs
one line per new address, and memory stays bounded)."""


class RequestErrors:
    """The ``logger`` of aiohttp's ``web_server.Server`` (it calls ``debug`` and ``exception``)."""

    def __init__(self, server: str, *, now: Callable[[], float] = time.monotonic) -> None:
        self._server = server
        self._now = now
        self._last: OrderedDict[str, float] = OrderedDict()
        self.suppressed = 0
        """Reports not logged because the address had one within ``REPEAT_S``."""

    def debug(self, *_args: object, **_kwargs: object) -> None:
        return

    def exception(
        self, message: str, *args: object, exc_info: object = None, **_kw: object
    ) -> None:
        client = clip(args[0] if args else "?", 64)
        now = self._now()
        last = self._last.get(client)
        if last is not None and now - last < REPEAT_S:
            self.suppressed += 1
            return
        self._last[client] = now
        self._last.move_to_end(client)
        while len(self._last) > MAX_ADDRESSES:
            self._last.popitem(last=False)
        error = exc_info if isinstance(exc_info, BaseException) else None
        log.warning(
            "http_request_failed",
            server=self._server,
            address=client,
            what=clip(message.split(" from ", 1)[0], 80),
            error=type(error).__name__ if error else "",
            detail=clip(error, 200) if error else "",
        )
