"""``nodeagent serve-session``: one mirror session's loopback server, in a process of its
own (decision 0064).

An import or a restore serves the store on 127.0.0.1 while the runtime pulls through the
mirror drop-in (``bundles.serving``). The server is the one ``BundleServer`` (every byte
hashed as it is sent); this process runs it for one session and ends, so the root daemon
never listens on a port nor loads aiohttp for imports.

Its standard input and output are one unix stream socket (``bundles.session`` says what
goes over it). Where ``[bundles] session_socket`` is set, systemd starts one per connection
(``nodeagent-session.socket``, ``Accept=yes``) as the unprivileged ``nodeagent-peer`` user
with no capability, seeing only the store; where it is empty (development and the test
harness), the daemon starts it as its own child with a socket pair.

It first sets no_new_privs and clears its capabilities (``adapters.privileges``), then
reads one spec line, binds 127.0.0.1, says ``listening``, streams its counters (at most
every ``TICK_S``) and each rejection, and ends when the daemon shuts its side of the socket
(or on SIGTERM): responses in progress end, then ``closed`` with the final counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from pathlib import Path
from typing import Final

import structlog

from nodeagent.adapters.http.mirror import BundleServer
from nodeagent.adapters.privileges import shed
from nodeagent.bundles.manifest import BundleError
from nodeagent.bundles.session import (
    MAX_SPEC_BYTES,
    SessionReport,
    parse_spec,
    render_report,
)
from nodeagent.strict import MalformedInput

log = structlog.get_logger(__name__)

TICK_S: Final = 0.2
"""How often counters that moved are sent (the daemon's probe waits on ``requests``)."""
SPEC_TIMEOUT_S: Final = 30.0
"""A spec that does not arrive within this ends the process (exit 65)."""
EX_DATAERR: Final = 65
EX_NOINPUT: Final = 66


class _Reports:
    """The report lines to the daemon, in order; a daemon gone away ends the session."""

    def __init__(self, writer: asyncio.StreamWriter, stop: asyncio.Event) -> None:
        self._writer, self._stop = writer, stop

    def send(self, report: SessionReport) -> None:
        if self._writer.is_closing():
            self._stop.set()
            return
        self._writer.write(render_report(report))

    def rejected(self, digest: str, err: BundleError) -> None:
        self.send(SessionReport("rejected", digest=digest, reason=err.reason, message=err.message))

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except OSError:
            self._stop.set()


async def _read_spec(reader: asyncio.StreamReader) -> bytes | None:
    try:
        async with asyncio.timeout(SPEC_TIMEOUT_S):
            return await reader.readuntil(b"\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as err:
        log.error("session_spec_not_read", error=type(err).__name__)
        return None


async def _until_stopped(reader: asyncio.StreamReader, stop: asyncio.Event) -> None:
    """The daemon shut its side (EOF; anything it sends after the spec is ignored)."""
    with contextlib.suppress(OSError):
        while await reader.read(4096):
            pass
    stop.set()


async def _serve(server: BundleServer, reports: _Reports, stop: asyncio.Event) -> None:
    sent = (0, 0)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TICK_S):
                await stop.wait()
        now = server.counters
        if (now.requests, now.bytes_served) != sent:
            sent = (now.requests, now.bytes_served)
            reports.send(SessionReport("counters", requests=sent[0], bytes_served=sent[1]))
        await reports.drain()


async def serve_session(fd: int = 0) -> int:
    """Serve one session on the socket at ``fd`` (the standard input); the exit status."""
    for failure in shed():  # already done by systemd under the socket unit
        log.warning("session_privileges_kept", error=failure)
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError as err:
        log.error("session_socket_missing", error=str(err))
        return EX_NOINPUT
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=MAX_SPEC_BYTES + 1)
    line = await _read_spec(reader)
    try:
        spec = parse_spec(line) if line is not None else None
    except MalformedInput as err:
        log.error("session_spec_refused", error=str(err))
        spec = None
    if spec is None:
        writer.close()
        return EX_DATAERR
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reports = _Reports(writer, stop)
    server = BundleServer(
        Path(spec.root),
        spec.files,
        tags=spec.tags,
        port=spec.port,
        arrival_wait_s=spec.arrival_wait_s,
        on_rejected=reports.rejected,
    )
    try:
        await server.start()
    except OSError as err:  # the daemon sees the socket end before "listening"
        log.error("session_server_not_started", error=str(err))
        writer.close()
        return 1
    reports.send(SessionReport("listening", port=server.port, pid=os.getpid(), uid=os.getuid()))
    watcher = asyncio.create_task(_until_stopped(reader, stop))
    try:
        await _serve(server, reports, stop)
    finally:
        await server.close()
        now = server.counters
        reports.send(SessionReport("closed", requests=now.requests, bytes_served=now.bytes_served))
        await reports.drain()
        watcher.cancel()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return 0
