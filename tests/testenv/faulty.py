"""A front for the real registry that can be made to fail: down, reset, 5xx, stalled blobs.

``RegistryFront(upstream_host)`` listens on ``127.0.0.1:<free port>`` and forwards each
HTTP request to the registry (one request per connection: it answers ``Connection:
close``, which Go's and Python's clients follow). A test switches its behaviour at any
time with ``set_fault``:

* ``Fault.PASS``: forward everything;
* ``Fault.DOWN``: no listening socket, so connecting is refused (``up`` again afterwards);
* ``Fault.RESET``: accept, then reset the connection (``SO_LINGER`` 0) before any answer;
* ``Fault.STATUS``: answer every request with ``status`` (500 by default) and no body;
* ``Fault.STALL``: forward, but a blob's body stops after ``stall_after_bytes`` and the
  connection hangs (open, silent) until the fault changes or the test ends.

``only`` limits a fault to requests whose path contains it (``"/manifests/"``,
``"/blobs/"``), ``agent`` to requests whose User-Agent contains it (``"nodeagent"``: the
daemon's own manifest look-ups, not CRI-O's pulls); others pass. Counters: requests
seen per fault, blob bytes sent. Nothing here is a stand-in: every answer that is not a
fault is the real registry's. A TLS hello is answered 400 at once, as the registry does,
so containers/image falls back to plain HTTP without waiting for its handshake timeout.
"""

from __future__ import annotations

import contextlib
import enum
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Self

from tests.testenv.lifecycle import Service
from tests.testenv.registry import free_port

_HEAD_LIMIT = 64 * 1024
_CHUNK = 64 * 1024


class Fault(enum.Enum):
    PASS = "pass"
    DOWN = "down"
    RESET = "reset"
    STATUS = "status"
    STALL = "stall"


@dataclass
class Counters:
    requests: dict[str, int] = field(default_factory=dict)
    """Requests by what was done to them (a ``Fault`` value)."""
    blob_bytes: int = 0
    """Body bytes of blob answers sent to clients."""
    stalled: int = 0
    """Connections held silent by ``STALL``."""


class RegistryFront(Service):
    """See the module docstring."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.port = free_port()
        self.fault = Fault.PASS
        self.status = 500
        self.only: str | None = None
        self.agent: str | None = None
        self.stall_after_bytes = 0
        self.counters = Counters()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = False

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ---------------------------------------------------------------- control
    def set_fault(
        self,
        fault: Fault,
        *,
        status: int = 500,
        only: str | None = None,
        agent: str | None = None,
        stall_after_bytes: int = 0,
    ) -> None:
        with self._changed:
            self.fault, self.status, self.only, self.agent = fault, status, only, agent
            self.stall_after_bytes = stall_after_bytes
            self._changed.notify_all()
        if fault is Fault.DOWN:
            self._close_listener()
        elif self._listener is None and not self._stopping:
            self._listen()

    def start(self) -> None:
        self._listen()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._close_listener()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> Self:
        self.start()
        return self

    # ---------------------------------------------------------------- listening
    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
            thread.start()

    # ---------------------------------------------------------------- one request
    def _count(self, what: Fault) -> None:
        with self._lock:
            self.counters.requests[what.value] = self.counters.requests.get(what.value, 0) + 1

    def _serve(self, client: socket.socket) -> None:
        with client:
            client.settimeout(30)
            first = client.recv(1, socket.MSG_PEEK)
            if not first.isalpha():  # a TLS hello (containers/image tries HTTPS first):
                client.sendall(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
                return  # answered at once, as the registry does, so HTTP is tried next
            head = _read_head(client)
            if head is None:
                return
            path = head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else ""
            agent = _header(head, b"user-agent")
            with self._lock:
                fault = self.fault
                if self.only is not None and self.only not in path:
                    fault = Fault.PASS
                if self.agent is not None and self.agent.lower() not in agent.lower():
                    fault = Fault.PASS
            self._count(fault)
            if fault is Fault.RESET:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            if fault is Fault.STATUS:
                client.sendall(
                    f"HTTP/1.1 {self.status} Injected Fault\r\nContent-Length: 0\r\n"
                    "Connection: close\r\n\r\n".encode()
                )
                return
            self._forward(client, head, is_blob="/blobs/" in path)

    def _forward(self, client: socket.socket, head: bytes, *, is_blob: bool) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=30)
        except OSError:
            return
        with upstream:
            upstream.sendall(_with_connection_close(head))
            response = _read_head(upstream, keep_rest=True)
            if response is None:
                return
            head_bytes, rest = response.split(b"\r\n\r\n", 1)
            client.sendall(_with_connection_close(head_bytes + b"\r\n\r\n"))
            sent = 0
            data = rest
            while True:
                if data:
                    if is_blob and not self._may_send(sent, len(data)):
                        allowed = max(self.stall_after_bytes - sent, 0)
                        client.sendall(data[:allowed])
                        self._hold()
                        return
                    if is_blob:  # counted first: a client that has it all sees it counted
                        with self._lock:
                            self.counters.blob_bytes += len(data)
                    client.sendall(data)
                    sent += len(data)
                data = upstream.recv(_CHUNK)
                if not data:
                    return

    def _may_send(self, sent: int, size: int) -> bool:
        with self._lock:
            return self.fault is not Fault.STALL or sent + size <= self.stall_after_bytes

    def _hold(self) -> None:
        """Keep the connection open and silent until the fault changes or the front stops."""
        with self._changed:
            self.counters.stalled += 1
            while self.fault is Fault.STALL and not self._stopping:
                self._changed.wait(timeout=1.0)


def _read_head(sock: socket.socket, *, keep_rest: bool = False) -> bytes | None:
    """Bytes up to the end of the HTTP head (the rest too with ``keep_rest``); None on EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(_CHUNK)
        except OSError:
            return None
        if not chunk or len(data) > _HEAD_LIMIT:
            return None
        data += chunk
    if keep_rest:
        return data
    head, _, _body = data.partition(b"\r\n\r\n")  # requests here (GET, HEAD) have no body
    return head + b"\r\n\r\n"


def _header(head: bytes, name: bytes) -> str:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return ""


def _with_connection_close(head: bytes) -> bytes:
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    kept = [line for line in lines if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n"
