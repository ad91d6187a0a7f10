"""``serving.BundleServerPort`` over a ``nodeagent serve-session`` process (decision 0064).

The daemon listens on no port: each mirror session (an import, a restore) gets its own
server process, asked for through ``nodeagent-session.socket`` (systemd starts it as the
unprivileged ``nodeagent-peer`` user: ``SocketLauncher``) or, with ``[bundles]
session_socket = ""``, started as the daemon's own child (``ChildLauncher``: development
and the test harness). Either way one unix stream socket carries the spec there and the
reports back (``bundles.session``).

What comes back is input: each line is bounded and parsed strictly; a line refused, or the
process ending before the session did, is one rejection (``BundleServerReportInvalid``,
``BundleServerLost``), so the import stops at once with that reason code instead of
pulling the rest from the images' registries; the process is then stopped. Starting waits
at most ``START_TIMEOUT_S``, closing at most ``CLOSE_TIMEOUT_S``: never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, Protocol

import structlog

from nodeagent.bundles.manifest import BundleError, ExpectedFile
from nodeagent.bundles.session import (
    MAX_REPORT_BYTES,
    SessionReport,
    SessionSpec,
    parse_report,
    render_spec,
)
from nodeagent.errors import BundleServerFailed, BundleServerLost, BundleServerReportInvalid
from nodeagent.strict import MalformedInput, clip

log = structlog.get_logger(__name__)

LOOPBACK: Final = "127.0.0.1"
START_TIMEOUT_S: Final = 30.0
"""From asking for the process to its ``listening`` line (it starts in about 0.3 s)."""
CLOSE_TIMEOUT_S: Final = 20.0
"""From ending the session to its ``closed`` line: the server lets responses in progress
end for 10 s, then drops them; beyond, the process is stopped."""


def blob_reasons() -> dict[str, type[BundleError]]:
    """The reason codes a rejection may carry: a blob's (every ``BundleError`` but the
    server's own), each with its class."""
    found: dict[str, type[BundleError]] = {}
    pending: list[type[BundleError]] = [BundleError]
    while pending:
        cls = pending.pop()
        if not issubclass(cls, BundleServerFailed):
            found[cls.reason] = cls
            pending.extend(cls.__subclasses__())
    return found


class Connection(Protocol):
    """One session's socket, and the process behind it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def stop(self) -> None:
        """End the process now (it did not end by itself)."""

    async def ended(self) -> None:
        """Wait for the process to end, when it is the daemon's child."""


class Launcher(Protocol):
    @property
    def describe(self) -> str: ...

    async def open(self) -> Connection: ...


class _Socketed:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def stop(self) -> None:
        self.writer.close()  # systemd's process sees the end of its input and stops

    async def ended(self) -> None:
        return None


class SocketLauncher:
    """A session process from ``nodeagent-session.socket`` (``Accept=yes``: one per
    connection, run as the unit's unprivileged user)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def describe(self) -> str:
        return f"socket {self.path}"

    async def open(self) -> Connection:
        reader, writer = await asyncio.open_unix_connection(
            str(self.path), limit=MAX_REPORT_BYTES + 1
        )
        return _Socketed(reader, writer)


class _Child(_Socketed):
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        process: asyncio.subprocess.Process,
    ) -> None:
        super().__init__(reader, writer)
        self.process = process

    async def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await super().stop()

    async def ended(self) -> None:
        await self.process.wait()


class ChildLauncher:
    """A session process started by the daemon itself, as its own user (``[bundles]
    session_socket = ""``), its standard input and output one end of a socket pair."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = tuple(argv)

    @property
    def describe(self) -> str:
        return "child process (the daemon's own user)"

    async def open(self) -> Connection:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv, stdin=theirs.fileno(), stdout=theirs.fileno(), close_fds=True
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=MAX_REPORT_BYTES + 1)
        return _Child(reader, writer, process)


async def _report_line(reader: asyncio.StreamReader) -> bytes | None:
    """One whole line, None at the end, ``MalformedInput`` for a line cut or too long."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as err:
        if err.partial:
            raise MalformedInput("a report line without its end") from None
        return None
    except asyncio.LimitOverrunError:
        raise MalformedInput(f"a report line over {MAX_REPORT_BYTES} bytes") from None


class SessionServer:
    """``serving.BundleServerPort``: ``blobs`` (digest → file under ``root``) and ``tags``
    served by a session process for one session."""

    def __init__(
        self,
        launcher: Launcher,
        root: Path,
        blobs: Mapping[str, ExpectedFile],
        tags: Mapping[str, str] | None = None,
        *,
        arrival_wait_s: int = 0,
        on_closed: Callable[[SessionServer], None] = lambda _served: None,
    ) -> None:
        self._launcher = launcher
        self._spec = SessionSpec(
            str(root), dict(blobs), dict(tags or {}), arrival_wait_s=arrival_wait_s
        )
        self._on_closed = on_closed
        self._reasons = blob_reasons()
        self._connection: Connection | None = None
        self._reading: asyncio.Task[None] | None = None
        self._listening: asyncio.Future[SessionReport] | None = None
        self._counters = SessionReport("counters")
        self._rejections: dict[str, BundleError] = {}
        self._failure: BundleServerFailed | None = None
        self._is_closed = False
        self._is_closing = False
        self.pid = 0
        """The session process's pid, as it said (0 before it listens)."""
        self.uid = -1
        """Its uid, as it said (-1 before it listens)."""
        self._port = 0

    @property
    def mirror_host(self) -> str:
        if not self._port:
            raise RuntimeError("session server not started")
        return f"{LOOPBACK}:{self._port}"

    @property
    def rejections(self) -> tuple[BundleError, ...]:
        failed = (self._failure,) if self._failure is not None else ()
        return (*self._rejections.values(), *failed)

    def bytes_served(self) -> int:
        return self._counters.bytes_served

    def requests_seen(self) -> int:
        return self._counters.requests

    async def start(self) -> None:
        """Ask for the process, send the spec, wait until it listens; ``BundleServerLost``
        when it cannot be had."""
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                self._connection = await self._launcher.open()
                self._connection.writer.write(render_spec(self._spec))
                await self._connection.writer.drain()
                self._listening = asyncio.get_running_loop().create_future()
                self._reading = asyncio.create_task(self._read(self._connection))
                listening = await asyncio.shield(self._listening)
        except (OSError, TimeoutError, BundleServerFailed) as err:
            await self._abandon()
            message = err.message if isinstance(err, BundleServerFailed) else clip(err, 200)
            lost = BundleServerLost(
                f"the loopback server ({self._launcher.describe}) did not start: {message}"
            )
            log.error("session_server_not_started", reason=lost.reason, error=lost.message)
            raise lost from None
        self._port, self.pid, self.uid = listening.port, listening.pid, listening.uid
        log.info("session_server_started", address=self.mirror_host, pid=self.pid, uid=self.uid,
                 blobs=len(self._spec.files), via=self._launcher.describe)  # fmt: skip

    async def close(self) -> None:
        """End the session: responses in progress end, the final counters come in."""
        if self._is_closed:
            return
        self._is_closed = self._is_closing = True
        connection, reading = self._connection, self._reading
        try:
            if connection is not None and reading is not None and not reading.done():
                with contextlib.suppress(OSError):
                    connection.writer.write_eof()
                try:
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await asyncio.shield(reading)
                except TimeoutError:
                    log.error("session_server_not_closed", pid=self.pid, seconds=CLOSE_TIMEOUT_S)
            await self._abandon()
            log.info("session_server_stopped", pid=self.pid, bytes=self.bytes_served())
        finally:
            self._on_closed(self)

    async def _abandon(self) -> None:
        if self._reading is not None and not self._reading.done():
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        if self._connection is not None:
            await self._connection.stop()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await self._connection.ended()

    async def _read(self, connection: Connection) -> None:
        """Take reports until ``closed`` and the end of the socket; a line refused or an
        early end is the session's failure."""
        is_closed = False
        try:
            while True:
                line = await _report_line(connection.reader)
                if line is None:
                    break
                is_closed = self._take(parse_report(line, frozenset(self._reasons)), is_closed)
        except MalformedInput as err:
            self._fail(BundleServerReportInvalid(f"the loopback server sent: {err}"))
            log.error("session_report_refused", pid=self.pid, error=str(err))
            await connection.stop()
            return
        except OSError as err:
            self._fail(BundleServerLost(f"the loopback server's socket failed: {clip(err, 200)}"))
            return
        if not is_closed:
            self._fail(BundleServerLost("the loopback server's process ended during the session"))
            log.error("session_server_lost", pid=self.pid, requests=self.requests_seen(),
                      bytes=self.bytes_served())  # fmt: skip

    def _take(self, report: SessionReport, is_closed: bool) -> bool:
        """Apply one report; whether it was ``closed``."""
        if is_closed:
            raise MalformedInput("a report after closed")
        listening = self._listening
        if report.event == "listening":
            if listening is None or listening.done():
                raise MalformedInput("listening twice")
            listening.set_result(report)
            return False
        if listening is None or not listening.done():
            raise MalformedInput(f"{report.event} before listening")
        if report.event == "rejected":
            self._reject(report)
            return False
        now = self._counters
        if report.requests < now.requests or report.bytes_served < now.bytes_served:
            raise MalformedInput("counters that went down")
        self._counters = report
        return report.event == "closed"

    def _reject(self, report: SessionReport) -> None:
        if report.digest not in self._spec.files:
            raise MalformedInput(f"a rejection of {report.digest}, which it does not serve")
        if report.digest not in self._rejections:
            err = self._reasons[report.reason](report.message)
            self._rejections[report.digest] = err
            log.error("bundle_blob_rejected", digest=report.digest, reason=err.reason,
                      error=err.message)  # fmt: skip

    def _fail(self, err: BundleServerFailed) -> None:
        listening = self._listening
        if listening is not None and not listening.done():
            listening.set_exception(err)
        elif self._failure is None and not (self._is_closing and isinstance(err, BundleServerLost)):
            self._failure = err
