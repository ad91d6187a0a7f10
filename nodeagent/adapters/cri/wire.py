"""gRPC over HTTP/2, the pure part: status codes, headers, message framing, call outcome.

nodeagent makes unary gRPC calls to CRI-O without grpcio (docs/decisions/0004). What a
unary call puts on the wire and how its answer is read is decided here, without I/O, so
that each rule of the gRPC HTTP/2 protocol is a function a unit test can hold to it;
``grpc_h2`` moves the bytes.

A request is HEADERS (``:method POST``, ``:path /package.Service/Method``,
``content-type: application/grpc``, ``te: trailers``, ``grpc-timeout``) and DATA holding
one message: a compressed flag byte (0), a 4-byte big-endian length, the protobuf bytes.
The answer is HEADERS, DATA with one message, then trailers carrying ``grpc-status`` and
a percent-encoded ``grpc-message``; an error may come as a single HEADERS frame that is
headers and trailers at once ("trailers-only"), which is how CRI-O reports most errors.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Iterable, Mapping
from typing import Final
from urllib.parse import unquote_to_bytes

from nodeagent.strict import clip

MESSAGE_PREFIX: Final = struct.Struct(">BI")
"""Compressed flag (1 byte) and message length (4 bytes, big-endian) before each message."""

FRAME_HEADER_BYTES: Final = 9
"""An HTTP/2 frame header: 24-bit payload length, type, flags, stream id."""

_TIMEOUT_MAX_DIGITS: Final = 99_999_999
"""``grpc-timeout`` allows at most 8 digits; the finest unit that fits is used."""

_TIMEOUT_UNITS: Final = (("m", 1_000.0), ("S", 1.0), ("M", 1 / 60), ("H", 1 / 3600))


class StatusCode(enum.IntEnum):
    """The gRPC status codes, numbered as on the wire (``grpc-status``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """A unary call ended with a status other than OK (from the runtime or from this client).

    The CRI adapter turns it into the error tree of ``nodeagent.errors``; nothing else
    sees it.
    """

    def __init__(self, code: StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


# gRPC's "HTTP to gRPC status code mapping", for answers that carry no grpc-status.
_HTTP_STATUS: Final = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}

# RST_STREAM error codes (RFC 9113 section 7) as gRPC reads them; every other one is INTERNAL.
_RESET_STATUS: Final = {
    0x7: StatusCode.UNAVAILABLE,  # REFUSED_STREAM: not processed, safe to try again
    0x8: StatusCode.CANCELLED,  # CANCEL
    0xB: StatusCode.RESOURCE_EXHAUSTED,  # ENHANCE_YOUR_CALM
    0xC: StatusCode.PERMISSION_DENIED,  # INADEQUATE_SECURITY
}


def timeout_header(timeout_s: float) -> bytes:
    """The ``grpc-timeout`` value for ``timeout_s`` (rounded up: never shorter than asked).

    >>> timeout_header(30), timeout_header(0.0004), timeout_header(86_400 * 3650)
    (b'30000m', b'1m', b'5256000M')
    """
    for unit, per_second in _TIMEOUT_UNITS:
        value = max(1, math.ceil(round(timeout_s * per_second, 6)))
        if value <= _TIMEOUT_MAX_DIGITS:
            return f"{value}{unit}".encode()
    return f"{_TIMEOUT_MAX_DIGITS}H".encode()


def request_headers(path: str, timeout_s: float) -> list[tuple[bytes, bytes]]:
    """HEADERS of a unary call to ``path`` (``/package.Service/Method``).

    ``:authority`` is a placeholder: a unix socket has no host, and CRI-O ignores it.
    No ``grpc-accept-encoding``: the server must then not compress its answer.
    """
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode("ascii")),
        (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"grpc-timeout", timeout_header(timeout_s)),
        (b"user-agent", b"nodeagent-grpc-h2"),
    ]


def encode_message(payload: bytes) -> bytes:
    """One uncompressed length-prefixed message, the body of a unary request."""
    return MESSAGE_PREFIX.pack(0, len(payload)) + payload


def header_map(headers: Iterable[tuple[bytes | str, bytes | str]]) -> dict[bytes, bytes]:
    """Header list as a dict of bytes (the last of repeated names wins)."""
    return {
        (name.encode() if isinstance(name, str) else name): (
            value.encode() if isinstance(value, str) else value
        )
        for name, value in headers
    }


def take_frames(buffer: bytearray, max_frame_bytes: int) -> list[bytes]:
    """Remove the complete HTTP/2 frames at the start of ``buffer`` and return them.

    h2 handles a received chunk as a whole: when one frame in it breaks the protocol,
    the events of the frames before it are lost. Fed one frame at a time, it reports
    the GOAWAY a server sends when it shuts down even though a PING follows in the
    same chunk (h2 refuses every frame after a GOAWAY). A frame longer than
    ``max_frame_bytes`` is handed over as it is, so that h2 refuses it at once
    instead of this buffer growing to the 16 MiB a length field allows.
    """
    frames: list[bytes] = []
    while len(buffer) >= FRAME_HEADER_BYTES:
        length = int.from_bytes(buffer[:3], "big")
        end = FRAME_HEADER_BYTES + length
        if length > max_frame_bytes:
            end = len(buffer)
        elif len(buffer) < end:
            break
        frames.append(bytes(buffer[:end]))
        del buffer[:end]
    return frames


def percent_decode(value: bytes) -> str:
    """Decode a ``grpc-message``: percent-encoded UTF-8, leniently.

    gRPC requires a client to keep a malformed message rather than fail on it: a ``%``
    not followed by two hex digits stays as it is, invalid UTF-8 becomes U+FFFD.
    """
    return unquote_to_bytes(value).decode("utf-8", errors="replace")


def parse_status(value: bytes) -> StatusCode:
    """``grpc-status`` as a code; anything that is not a known number is UNKNOWN."""
    if not 1 <= len(value) <= 2 or not value.isdigit():  # codes are 0..16
        return StatusCode.UNKNOWN
    try:
        return StatusCode(int(value))
    except ValueError:  # a number that is no code
        return StatusCode.UNKNOWN


def http_status_number(value: bytes) -> int:
    """``:status`` as a number: three ASCII digits (RFC 9110, section 15), anything else 0.

    Never ``int()`` of the raw value: a value of more than 4,300 digits raises ``ValueError``.
    """
    return int(value) if len(value) == 3 and value.isdigit() else 0


def reset_status(error_code: int) -> StatusCode:
    """The status of a call whose stream the server reset with ``error_code``."""
    return _RESET_STATUS.get(error_code, StatusCode.INTERNAL)


def call_status(headers: Mapping[bytes, bytes]) -> tuple[StatusCode, str] | None:
    """``grpc-status`` and decoded ``grpc-message`` of trailers, or None if absent."""
    raw = headers.get(b"grpc-status")
    if raw is None:
        return None
    return parse_status(raw), percent_decode(headers.get(b"grpc-message", b""))


class MessageAssembler:
    """Reassembles the length-prefixed messages of a response body from DATA frames.

    Refuses as soon as a prefix is read, before buffering the message: a compressed
    message (nodeagent offers no encoding, so a server must not send one) and a message
    over ``max_bytes`` (ListImages on a node with thousands of images is a few MiB).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.messages: list[bytes] = []
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        """Add DATA bytes; raise ``RpcError`` for a compressed or oversized message."""
        self._buffer += data
        while len(self._buffer) >= MESSAGE_PREFIX.size:
            flag, length = MESSAGE_PREFIX.unpack_from(self._buffer)
            if flag != 0:
                raise RpcError(
                    StatusCode.INTERNAL,
                    f"the runtime sent a compressed message (flag {flag}); "
                    "this client asks for none and cannot decompress",
                )
            if length > self.max_bytes:
                raise RpcError(
                    StatusCode.RESOURCE_EXHAUSTED,
                    f"response message of {length} bytes is over the limit of "
                    f"{self.max_bytes} bytes",
                )
            end = MESSAGE_PREFIX.size + length
            if len(self._buffer) < end:
                return
            self.messages.append(bytes(self._buffer[MESSAGE_PREFIX.size : end]))
            del self._buffer[:end]

    def single_message(self) -> bytes:
        """The one message of a unary response; ``RpcError`` if the body is not exactly one."""
        if self._buffer:
            raise RpcError(
                StatusCode.INTERNAL,
                f"response body ended inside a message ({len(self._buffer)} bytes left over)",
            )
        if len(self.messages) != 1:
            raise RpcError(
                StatusCode.INTERNAL,
                f"a unary call needs one response message, the runtime sent {len(self.messages)}",
            )
        return self.messages[0]


def call_result(
    headers: Mapping[bytes, bytes] | None,
    trailers: Mapping[bytes, bytes] | None,
    body: MessageAssembler,
) -> bytes:
    """The response message of a finished unary call; ``RpcError`` for every other end.

    The status comes from the trailers, or from the headers of a trailers-only answer.
    An HTTP status other than 200 without a ``grpc-status`` (a proxy, not a gRPC
    server) is mapped as gRPC prescribes.
    """
    if headers is None:
        raise RpcError(StatusCode.INTERNAL, "the stream ended before any response headers")
    status = call_status(trailers if trailers is not None else headers)
    http_status = headers.get(b":status", b"")
    if status is None and http_status != b"200":
        raise RpcError(
            _HTTP_STATUS.get(http_status_number(http_status), StatusCode.UNKNOWN),
            f"HTTP status {clip(http_status.decode(errors='replace'), 40)} and no grpc-status",
        )
    if status is None:
        raise RpcError(StatusCode.INTERNAL, "the call ended without a grpc-status")
    code, message = status
    if code != StatusCode.OK:
        raise RpcError(code, message)
    return body.single_message()
