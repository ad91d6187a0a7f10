"""A fault-injecting HTTP proxy on loopback in front of a real registry.

The real ``docker-registry`` cannot be told to answer 500, to hang in the middle of a
blob or to go away for 20 seconds and come back on the same port. ``FaultyProxy``
stands between the clients (CRI-O, nodeagent) and the registry and does those things
on demand, while every byte it does pass comes from the real registry::

    with FaultyProxy(registry.host) as proxy:
        ref = image_ref.replace(registry.host, proxy.host)
        proxy.throttle(8 << 20)                # 8 MiB/s for every response body
        proxy.answer_errors(500, for_s=10)     # 10 s of HTTP 500, then pass-through
        proxy.refuse()                         # connection refused (open ones are reset)
        proxy.serve()                          # listening again, on the same port
        proxy.stall_bodies(after_bytes=64 << 10, match=is_blob)  # hang mid-body
        proxy.heal()                           # no fault left (the rate stays)

How it works: an asyncio server on ``127.0.0.1:<free port>`` in a thread of its own.
Each client connection carries exactly one request: the proxy reads its head, forwards
it on a fresh upstream connection with ``Connection: close`` and relays the answer with
``Connection: close`` too, so the client opens a new connection for its next request
and every fault decision is per request. Clients that try TLS first (containers/image
does for a registry marked insecure) get their connection closed and fall back to plain
HTTP, as with the registry itself.

Every request is recorded as an ``Exchange`` (method, path, User-Agent, status, body
bytes relayed, the fault applied), so a test can tell CRI-O's requests from nodeagent's
(``is_from_nodeagent``: nodeagent's User-Agent is ``nodeagent/<version>``) and count how
often each blob crossed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tests.testenv.lifecycle import Service
from tests.testenv.registry import free_port
from tests.testenv.waiting import wait_for

CHUNK_BYTES = 64 * 1024
MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 30.0
ERROR_BODY = b'{"errors":[{"code":"UNKNOWN","message":"fault injected by the test proxy"}]}'
REASONS = {
    401: "Unauthorized",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}

Fault = Literal["", "error", "stall", "reset"]


@dataclass(frozen=True)
class Request:
    """The head of one client request, as the proxy saw it."""

    method: str
    path: str
    user_agent: str

    @property
    def is_blob(self) -> bool:
        return "/blobs/sha256:" in self.path

    @property
    def is_manifest(self) -> bool:
        return "/manifests/" in self.path

    @property
    def is_from_nodeagent(self) -> bool:
        """Sent by nodeagent's own registry client (disk admission), not by the runtime."""
        return self.user_agent.startswith("nodeagent/")


Match = Callable[[Request], bool]


def any_request(_request: Request) -> bool:
    return True


def is_blob(request: Request) -> bool:
    return request.is_blob


@dataclass(frozen=True)
class Exchange:
    """One request and what the proxy did with it."""

    request: Request
    started_s: float
    status: int | None = None
    body_bytes: int = 0
    fault: Fault = ""
    is_done: bool = False


@dataclass
class _ErrorRule:
    status: int
    match: Match
    remaining: int | None
    until_s: float | None
    headers: Mapping[str, str]

    def applies(self, request: Request, now_s: float) -> bool:
        if self.until_s is not None and now_s >= self.until_s:
            return False
        if self.remaining is not None and self.remaining <= 0:
            return False
        return self.match(request)


@dataclass
class _Faults:
    errors: _ErrorRule | None = None
    stall_match: Match | None = None
    stall_after_bytes: int = 0
    bytes_per_s: float | None = None
    stalled: set[asyncio.StreamWriter] = field(default_factory=set)


class FaultyProxy(Service):
    """Pass-through, refused, erroring, stalling or slow: one registry, faults on demand."""

    def __init__(self, upstream: str, *, port: int | None = None) -> None:
        host, _, port_text = upstream.rpartition(":")
        self.upstream_host, self.upstream_port = host, int(port_text)
        self.port = port or free_port()
        self._lock = threading.Lock()
        self._faults = _Faults()
        self._exchanges: list[Exchange] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._next_free_s = 0.0

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``: put it in image references instead of the registry's."""
        return f"127.0.0.1:{self.port}"

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="faulty-proxy", daemon=True)
        self._thread.start()
        self.serve()

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()

    # ---------------------------------------------------------------- faults
    def serve(self) -> None:
        """Listen (again, on the same port): connections are accepted."""
        self._call(self._listen())

    def refuse(self) -> None:
        """Stop listening and reset every open connection: the registry is down."""
        self._call(self._close_all())

    def answer_errors(
        self,
        status: int = 500,
        *,
        count: int | None = None,
        for_s: float | None = None,
        match: Match = any_request,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Answer ``status`` (no upstream request) to matching requests: the next ``count``
        of them, or all of them for ``for_s`` seconds, or all until ``heal``; ``headers``
        go into each answer (a ``WWW-Authenticate`` challenge with a 401, say)."""
        until = None if for_s is None else time.monotonic() + for_s
        with self._lock:
            self._faults.errors = _ErrorRule(status, match, count, until, dict(headers or {}))

    def stall_bodies(self, *, after_bytes: int = CHUNK_BYTES, match: Match = is_blob) -> None:
        """Relay the head and ``after_bytes`` of each matching answer's body, then nothing:
        the connection stays open and silent until the client gives up (or ``heal``)."""
        with self._lock:
            self._faults.stall_match, self._faults.stall_after_bytes = match, after_bytes

    def throttle(self, bytes_per_s: float | None) -> None:
        """Limit the bytes of every answer, all connections together (None: no limit)."""
        with self._lock:
            self._faults.bytes_per_s = bytes_per_s

    def heal(self) -> None:
        """No more errors or stalls (stalled connections are reset); listening; rate kept."""
        with self._lock:
            self._faults.errors = None
            self._faults.stall_match = None
        self._call(self._reset_stalled())
        self.serve()

    # ---------------------------------------------------------------- what happened
    def exchanges(self) -> list[Exchange]:
        with self._lock:
            return list(self._exchanges)

    def body_bytes(self, match: Match = any_request) -> int:
        return sum(e.body_bytes for e in self.exchanges() if match(e.request))

    def blob_fetches(self) -> dict[str, int]:
        """Per blob digest, how many GETs of it were relayed in full (status 200)."""
        counts: dict[str, int] = {}
        for e in self.exchanges():
            request = e.request
            if request.method == "GET" and request.is_blob and e.status == 200 and not e.fault:
                digest = request.path.rsplit("/", 1)[-1]
                counts[digest] = counts.get(digest, 0) + 1
        return counts

    def wait_body_bytes(self, at_least: int, *, match: Match = any_request, **kw: Any) -> int:
        return wait_for(
            lambda: self.body_bytes(match) >= at_least and self.body_bytes(match),
            timeout_s=kw.get("timeout_s", 60.0),
            interval_s=0.02,
            what=f"{at_least} body bytes through the proxy",
        )

    # ---------------------------------------------------------------- loop side
    def _call(self, coro: Any) -> None:
        assert self._loop is not None, "proxy not started"
        future: Future[None] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        future.result(timeout=10)

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._handle, "127.0.0.1", self.port, reuse_address=True
            )

    async def _close_all(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            _abort(writer)
        if server is not None:
            await server.wait_closed()

    async def _reset_stalled(self) -> None:
        for writer in list(self._faults.stalled):
            _abort(writer)
        self._faults.stalled.clear()

    async def _shutdown(self) -> None:
        await self._close_all()
        # The connections were aborted: their handlers end now; none is left pending when
        # the loop closes (a pending task destroyed is reported at some later test).
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    def _record(self, index: int, **changes: Any) -> None:
        with self._lock:
            self._exchanges[index] = replace(self._exchanges[index], **changes)

    def _error_rule(self, request: Request) -> _ErrorRule | None:
        with self._lock:
            rule = self._faults.errors
            if rule is None or not rule.applies(request, time.monotonic()):
                return None
            if rule.remaining is not None:
                rule.remaining -= 1
            return rule

    def _stall_after(self, request: Request) -> int | None:
        with self._lock:
            match = self._faults.stall_match
            is_stalled = match is not None and match(request)
            return self._faults.stall_after_bytes if is_stalled else None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = await _read_head(reader)
            if head is not None:
                await self._exchange(head, reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the client went away, or the proxy reset it: nothing to relay
        finally:
            self._writers.discard(writer)
            self._faults.stalled.discard(writer)
            _abort(writer)

    async def _exchange(
        self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        request, body_length = _parse_request(head)
        with self._lock:
            index = len(self._exchanges)
            self._exchanges.append(Exchange(request, time.monotonic()))
        body = await reader.readexactly(body_length) if body_length else b""
        rule = self._error_rule(request)
        if rule is not None:
            writer.write(_error_answer(rule.status, rule.headers))
            await writer.drain()
            self._record(index, status=rule.status, fault="error", is_done=True)
            return
        try:
            await self._relay(index, request, head + body, reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            with self._lock:
                stalled = self._exchanges[index].fault == "stall"
            self._record(index, fault="stall" if stalled else "reset", is_done=True)
            raise

    async def _relay(
        self,
        index: int,
        request: Request,
        message: bytes,
        client_reader: asyncio.StreamReader,
        client: asyncio.StreamWriter,
    ) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        head, _, body = message.partition(b"\r\n\r\n")
        try:
            up_writer.write(_with_close(head + b"\r\n\r\n") + body)
            await up_writer.drain()
            answer_head = await _read_head(up_reader)
            if answer_head is None:
                raise ConnectionResetError("the registry closed without answering")
            status = int(answer_head.split(b" ", 2)[1])
            self._record(index, status=status)
            client.write(_with_close(answer_head))
            stall_after = self._stall_after(request)
            sent = 0
            while chunk := await up_reader.read(CHUNK_BYTES):
                if stall_after is not None and sent + len(chunk) > stall_after:
                    chunk = chunk[: max(stall_after - sent, 0)]
                await self._pace(len(chunk))
                client.write(chunk)
                await client.drain()
                sent += len(chunk)
                self._record(index, body_bytes=sent)
                if stall_after is not None and sent >= stall_after:
                    self._record(index, fault="stall")
                    self._faults.stalled.add(client)
                    await client_reader.read()  # silent until the client gives up
                    raise ConnectionResetError("stalled connection ended")
            self._record(index, is_done=True)
        finally:
            _abort(up_writer)

    async def _pace(self, size: int) -> None:
        rate = self._faults.bytes_per_s
        if not rate or not size:
            return
        now = time.monotonic()
        start = max(now, self._next_free_s)
        self._next_free_s = start + size / rate
        await asyncio.sleep(self._next_free_s - now)


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The head of an HTTP/1.1 message (through the blank line), or None if it is not HTTP."""
    first = await asyncio.wait_for(reader.read(1), HEAD_TIMEOUT_S)
    if not first or not first.isalpha():  # EOF, or a TLS ClientHello (0x16)
        return None
    rest = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
    if len(rest) > MAX_HEAD_BYTES:
        return None
    return first + rest


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    pairs = (line.split(":", 1) for line in lines if ":" in line)
    return {name.strip().lower(): value.strip() for name, value in pairs}


def _parse_request(head: bytes) -> tuple[Request, int]:
    method, path = head.split(b" ", 2)[:2]
    headers = _headers(head)
    length = int(headers.get("content-length", "0") or 0)
    request = Request(
        method.decode("latin-1"), path.decode("latin-1"), headers.get("user-agent", "")
    )
    return request, length


def _with_close(head: bytes) -> bytes:
    """The same head with ``Connection: close`` instead of any Connection/Keep-Alive header."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    kept = [
        line
        for line in lines[1:]
        if line.split(b":", 1)[0].strip().lower() not in (b"connection", b"keep-alive")
    ]
    return b"\r\n".join([lines[0], *kept, b"Connection: close"]) + b"\r\n\r\n"


def _error_answer(status: int, headers: Mapping[str, str]) -> bytes:
    reason = REASONS.get(status, "Error").encode()
    extra = b"".join(f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items())
    head = (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"%sConnection: close\r\n\r\n" % (status, reason, len(ERROR_BODY), extra)
    )
    return head + ERROR_BODY


def _abort(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.transport.abort()
