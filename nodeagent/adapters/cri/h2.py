"""Unary gRPC calls over one HTTP/2 connection to a unix socket (h2 and asyncio streams).

Replaces grpcio, whose C core alone held 10 MiB of the daemon's idle memory
(docs/decisions/0004-cri-client-over-h2.md). It does what the CRI adapter needs and no
more: unary calls, plain HTTP/2 on a unix socket, no compression, no retries (callers
retry), no keepalive pings. The protocol rules are pure functions in ``grpc_wire``; this
module moves bytes and keeps the connection's state.

- One connection per ``Channel``, opened by the first call, shared by every call in
  flight; a call waits for a free stream when the server's MAX_CONCURRENT_STREAMS is
  reached.
- Flow control both ways: received DATA is acknowledged as it arrives (a ListImages
  answer of several hundred KiB is larger than the 64 KiB initial window), a request is
  sent in pieces the server's window allows.
- Every call has a deadline, sent as ``grpc-timeout`` and enforced here too: on expiry
  the stream is reset with CANCEL and the call fails with DEADLINE_EXCEEDED.
- A broken connection (no socket, refused, end of file, GOAWAY, a protocol error) fails
  the calls on it with UNAVAILABLE at once; the next call opens a new connection. A call
  never waits for the runtime to appear.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from nodeagent.adapters.cri.wire import (
    MessageAssembler,
    RpcError,
    StatusCode,
    call_result,
    encode_message,
    header_map,
    request_headers,
    reset_status,
    take_frames,
)

_READ_BYTES: Final = 64 * 1024
_CLOSE_TIMEOUT_S: Final = 1.0
"""How long ``close`` lets the socket flush its GOAWAY before dropping it."""


def _unavailable(what: str, exc: BaseException | None = None) -> RpcError:
    reason = f": {exc.strerror or exc}" if isinstance(exc, OSError) else ""
    return RpcError(StatusCode.UNAVAILABLE, f"{what}{reason}")


def _fresh(error: RpcError) -> RpcError:
    """A copy to raise: one connection's failure ends many calls, each raises its own."""
    return RpcError(error.code, error.details)


def _error_name(code: int) -> str:
    """An HTTP/2 error code's name (``CANCEL``), or its number if h2 does not know it."""
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return str(code)


class _Call:
    """One stream: written by the connection's reader, awaited by the caller."""

    __slots__ = ("body", "ended", "headers", "outcome", "request_sent", "trailers", "window")

    def __init__(self, max_message_bytes: int) -> None:
        self.headers: dict[bytes, bytes] | None = None
        self.trailers: dict[bytes, bytes] | None = None
        self.body = MessageAssembler(max_message_bytes)
        self.outcome: bytes | RpcError | None = None
        self.ended = asyncio.Event()
        self.window = asyncio.Event()
        """Set when the send window may have grown (or the call ended)."""
        self.request_sent = False

    def finish(self) -> None:
        try:
            self.end(call_result(self.headers, self.trailers, self.body))
        except RpcError as exc:
            self.end(exc)

    def end(self, outcome: bytes | RpcError) -> None:
        if self.outcome is None:
            self.outcome = outcome
        self.ended.set()
        self.window.set()

    def result(self) -> bytes:
        if isinstance(self.outcome, bytes):
            return self.outcome
        raise _fresh(self.outcome or RpcError(StatusCode.INTERNAL, "the call has not ended"))


class _Connection:
    """One HTTP/2 connection: a reader task dispatching h2 events to the calls."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_message_bytes: int
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._max_message_bytes = max_message_bytes
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self._h2 = h2.connection.H2Connection(config)
        self._calls: dict[int, _Call] = {}
        self.failure: RpcError | None = None
        self._draining = False
        self._settings = asyncio.Event()
        """The server's first SETTINGS arrived: its stream limit is known."""
        self._slot_freed = asyncio.Event()
        self._reader_task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, path: str, max_message_bytes: int) -> _Connection:
        try:
            reader, writer = await asyncio.open_unix_connection(path)
        except OSError as exc:
            raise _unavailable(f"cannot connect to {path}", exc) from exc
        connection = cls(reader, writer, max_message_bytes)
        connection._h2.initiate_connection()
        connection._write()
        connection._reader_task = asyncio.create_task(connection._read_loop())
        return connection

    @property
    def is_usable(self) -> bool:
        return self.failure is None and not self._draining

    async def call(self, path: str, request: bytes, deadline: float) -> bytes:
        """One unary call; ``deadline`` in loop time, for ``grpc-timeout``."""
        stream_id, call = await self._start(path, deadline)
        try:
            await self._flush()
            await self._send(stream_id, call, encode_message(request))
            await call.ended.wait()
            return call.result()
        finally:
            self._end(stream_id, call)

    async def close(self) -> None:
        """Say GOAWAY, close the socket, stop the reader; calls still in flight fail."""
        was_open = self.failure is None
        if was_open:
            self._h2.close_connection()
            self._write()
        self._fail(RpcError(StatusCode.CANCELLED, "the client closed its connection"), abort=False)
        if was_open:
            try:
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await self._writer.wait_closed()
            except (OSError, TimeoutError):
                self._writer.transport.abort()  # the server does not read: drop the GOAWAY
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.wait([self._reader_task])

    # ------------------------------------------------------------ sending
    async def _start(self, path: str, deadline: float) -> tuple[int, _Call]:
        """Wait for a free stream and send the call's HEADERS (written, not yet flushed).

        Nothing after the stream is opened awaits, so a cancelled caller never leaves
        an open stream behind: from here on ``call`` resets it in its ``finally``.
        """
        await self._settings.wait()
        while self._at_stream_limit():
            self._slot_freed.clear()
            await self._slot_freed.wait()
        try:
            stream_id = self._h2.get_next_available_stream_id()
        except h2.exceptions.NoAvailableStreamIDError as exc:
            self._draining = True  # the next call opens a new connection
            raise _unavailable("HTTP/2 stream ids used up on this connection") from exc
        call = _Call(self._max_message_bytes)
        self._calls[stream_id] = call
        timeout_s = deadline - asyncio.get_running_loop().time()
        self._h2.send_headers(stream_id, request_headers(path, timeout_s))
        self._write()
        return stream_id, call

    def _at_stream_limit(self) -> bool:
        if self.failure is not None:
            raise _fresh(self.failure)
        limit = self._h2.remote_settings.max_concurrent_streams
        return self._h2.open_outbound_streams >= limit

    async def _send(self, stream_id: int, call: _Call, body: bytes) -> None:
        """Send the request in pieces that fit the server's flow-control windows."""
        view = memoryview(body)
        while view and not call.ended.is_set():
            if self.failure is not None:
                raise _fresh(self.failure)
            try:
                size = min(
                    len(view),
                    self._h2.local_flow_control_window(stream_id),
                    self._h2.max_outbound_frame_size,
                )
                if size > 0:
                    end = size == len(view)
                    self._h2.send_data(stream_id, view[:size].tobytes(), end_stream=end)
            except h2.exceptions.StreamClosedError:
                call.end(RpcError(StatusCode.INTERNAL, "stream closed before the request was sent"))
                break
            if size <= 0:
                call.window.clear()
                await call.window.wait()
                continue
            view = view[size:]
            await self._flush()
        call.request_sent = not view

    def _end(self, stream_id: int, call: _Call) -> None:
        """The caller is done: cancel a stream still open (deadline, early answer)."""
        del self._calls[stream_id]
        if self.failure is None and not (call.ended.is_set() and call.request_sent):
            with contextlib.suppress(h2.exceptions.StreamClosedError):  # closed meanwhile
                self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            self._write()
        self._slot_freed.set()
        if self._draining and not self._calls:
            self._fail(RpcError(StatusCode.UNAVAILABLE, "connection retired"))

    def _write(self) -> None:
        data = self._h2.data_to_send()
        if data and not self._writer.is_closing():
            self._writer.write(data)

    async def _flush(self) -> None:
        self._write()
        try:
            await self._writer.drain()
        except OSError as exc:
            self._fail(_unavailable("the connection to the runtime broke", exc))
        if self.failure is not None:
            raise _fresh(self.failure)

    # ------------------------------------------------------------ receiving
    async def _read_loop(self) -> None:
        failure = RpcError(StatusCode.INTERNAL, "the connection's reader stopped")
        received = bytearray()
        try:
            while True:
                data = await self._reader.read(_READ_BYTES)
                if not data:
                    failure = _unavailable("the runtime closed the connection")
                    return
                received += data
                for frame in take_frames(received, self._h2.max_inbound_frame_size):
                    for event in self._h2.receive_data(frame):
                        self._dispatch(event)
                self._write()
        except RpcError as exc:
            failure = exc
        except OSError as exc:
            failure = _unavailable("the connection to the runtime broke", exc)
        except h2.exceptions.H2Error as exc:
            self._write()  # h2's GOAWAY, as a courtesy
            failure = _unavailable(f"HTTP/2 protocol error on the runtime's connection: {exc}")
        finally:
            self._fail(failure)

    def _dispatch(self, event: h2.events.Event) -> None:
        """Hand one h2 event to its call; events for calls no one waits for are dropped."""
        match event:
            case h2.events.RemoteSettingsChanged():
                self._settings.set()
                self._slot_freed.set()  # the stream limit may have grown
                self._on_window(0)  # and the initial window
            case h2.events.ResponseReceived() | h2.events.TrailersReceived():
                self._on_headers(event)
            case h2.events.DataReceived():
                self._on_data(event)
            case h2.events.StreamEnded():
                if call := self._calls.get(event.stream_id):
                    call.finish()
            case h2.events.StreamReset():
                self._on_reset(event)
            case h2.events.WindowUpdated():
                self._on_window(event.stream_id)
            case h2.events.ConnectionTerminated():
                code = _error_name(int(event.error_code or 0))
                raise _unavailable(f"the runtime ended the connection (GOAWAY {code})")

    def _on_headers(self, event: h2.events.ResponseReceived | h2.events.TrailersReceived) -> None:
        call = self._calls.get(event.stream_id)
        if call is None:
            return
        if isinstance(event, h2.events.ResponseReceived):
            call.headers = header_map(event.headers)
        else:
            call.trailers = header_map(event.headers)

    def _on_reset(self, event: h2.events.StreamReset) -> None:
        if call := self._calls.get(event.stream_id):
            code = int(event.error_code)
            reason = f"the runtime reset the stream ({_error_name(code)})"
            call.end(RpcError(reset_status(code), reason))

    def _on_data(self, event: h2.events.DataReceived) -> None:
        # Always give the window back, also for a stream nobody waits for any more:
        # otherwise the connection's window would shrink until every call stalls.
        self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        call = self._calls.get(event.stream_id)
        if call is None or call.ended.is_set():
            return
        try:
            call.body.feed(event.data)
        except RpcError as exc:
            call.end(exc)
            with contextlib.suppress(h2.exceptions.StreamClosedError):  # ended with this DATA
                self._h2.reset_stream(event.stream_id, h2.errors.ErrorCodes.CANCEL)

    def _on_window(self, stream_id: int) -> None:
        if stream_id == 0:
            for each in self._calls.values():
                each.window.set()
        elif call := self._calls.get(stream_id):
            call.window.set()

    def _fail(self, error: RpcError, *, abort: bool = True) -> None:
        """The connection is over: fail its calls, wake every waiter, drop the socket.

        ``abort`` discards what is not yet written (the peer is gone or broke the
        protocol); a clean close lets the GOAWAY go out first.
        """
        if self.failure is None:
            self.failure = error
        for call in self._calls.values():
            call.end(self.failure)
        self._settings.set()
        self._slot_freed.set()
        if self._writer.is_closing():
            return
        if abort:
            self._writer.transport.abort()
        else:
            self._writer.close()


class Channel:
    """Unary gRPC calls to the server on one unix socket; implements what ``cri`` needs.

    Created without an event loop (the daemon's wiring is built before the loop runs);
    the connection is opened by the first call, inside the loop.
    """

    def __init__(self, path: str, *, max_message_bytes: int) -> None:
        self.path = path
        self.max_message_bytes = max_message_bytes
        self._connection: _Connection | None = None
        self._connecting = asyncio.Lock()
        self._closed = False
        self.connections_opened = 0
        """Connections this channel has opened: 1 plus one per broken connection replaced."""

    async def unary(self, method: str, request: bytes, *, timeout_s: float) -> bytes:
        """Call ``method`` (``/package.Service/Method``) with serialized ``request``.

        Returns the serialized response; raises ``RpcError`` with the call's status.
        """
        deadline = asyncio.get_running_loop().time() + timeout_s
        timeout = asyncio.timeout_at(deadline)
        try:
            async with timeout:
                connection = await self._connect()
                return await connection.call(method, request, deadline)
        except TimeoutError as exc:
            if not timeout.expired():
                raise
            raise RpcError(
                StatusCode.DEADLINE_EXCEEDED, f"Deadline Exceeded ({timeout_s:g} s)"
            ) from exc

    async def close(self) -> None:
        """Close the connection (GOAWAY); later calls fail with CANCELLED."""
        self._closed = True
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    async def _connect(self) -> _Connection:
        async with self._connecting:
            if self._closed:
                raise RpcError(StatusCode.CANCELLED, "the client was closed")
            if self._connection is None or not self._connection.is_usable:
                self._connection = await _Connection.open(self.path, self.max_message_bytes)
                self.connections_opened += 1
            return self._connection
