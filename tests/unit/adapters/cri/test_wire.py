"""gRPC over HTTP/2, the pure part: framing, headers, trailers, status codes."""

from __future__ import annotations

import pytest
from hyperframe.frame import DataFrame, GoAwayFrame, PingFrame, SettingsFrame

from nodeagent.adapters.cri.wire import (
    MessageAssembler,
    RpcError,
    StatusCode,
    call_result,
    call_status,
    encode_message,
    header_map,
    parse_status,
    percent_decode,
    request_headers,
    reset_status,
    take_frames,
    timeout_header,
)

MIB = 1024 * 1024


def test_status_codes_are_grpcs_numbers() -> None:
    # https://grpc.github.io/grpc/core/md_doc_statuscodes.html, in order.
    names = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ]
    assert [(code.value, code.name) for code in StatusCode] == list(enumerate(names))


@pytest.mark.parametrize(
    ("timeout_s", "header"),
    [
        (30, b"30000m"),
        (0.25, b"250m"),
        (0.0004, b"1m"),  # rounded up, never 0
        (0, b"1m"),
        (-3, b"1m"),  # already past: the server gives up at once
        (0.3, b"300m"),  # no float noise (0.3 * 1000 is 300.00000000000006)
        (86_400, b"86400000m"),  # the pull backstop, 24 h, still in milliseconds
        (99_999.999, b"99999999m"),
        (100_000, b"100000S"),
        (86_400 * 3650, b"5256000M"),
        (100_000_000 * 60, b"1666667H"),
    ],
)
def test_timeout_header(timeout_s: float, header: bytes) -> None:
    assert timeout_header(timeout_s) == header
    assert len(header) <= 9  # at most 8 digits and the unit


def test_request_headers() -> None:
    headers = request_headers("/runtime.v1.ImageService/PullImage", 30)
    assert headers[:4] == [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/runtime.v1.ImageService/PullImage"),
        (b":authority", b"localhost"),
    ]
    named = dict(headers)
    assert named[b"content-type"] == b"application/grpc"
    assert named[b"te"] == b"trailers"
    assert named[b"grpc-timeout"] == b"30000m"
    assert b"grpc-encoding" not in named
    assert b"grpc-accept-encoding" not in named  # so the server must not compress


@pytest.mark.parametrize("payload", [b"", b"\x0a\x02v1", bytes(range(256)) * 300])
def test_message_round_trip_in_any_pieces(payload: bytes) -> None:
    framed = encode_message(payload)
    assert framed[:5] == b"\x00" + len(payload).to_bytes(4, "big")
    for piece in (1, 2, 5, 7, 4096):
        body = MessageAssembler(MIB)
        for start in range(0, len(framed), piece):
            body.feed(framed[start : start + piece])
        assert body.single_message() == payload


def test_compressed_message_is_refused_at_its_prefix() -> None:
    body = MessageAssembler(MIB)
    with pytest.raises(RpcError) as info:
        body.feed(b"\x01\x00\x00\x00\x10")  # the 16 bytes never come: refused before
    assert info.value.code is StatusCode.INTERNAL
    assert "compressed" in info.value.details


def test_message_over_the_limit_is_refused_before_it_is_buffered() -> None:
    body = MessageAssembler(16 * MIB)
    with pytest.raises(RpcError) as info:
        body.feed((16 * MIB + 1).to_bytes(4, "big").rjust(5, b"\x00") + b"x" * 100)
    assert info.value.code is StatusCode.RESOURCE_EXHAUSTED
    assert "16777217 bytes" in info.value.details
    assert "16777216" in info.value.details
    exactly = MessageAssembler(16)
    exactly.feed(encode_message(b"y" * 16))
    assert exactly.single_message() == b"y" * 16


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "needs one response message, the runtime sent 0"),
        (encode_message(b"a") + encode_message(b"b"), "the runtime sent 2"),
        (encode_message(b"abc")[:-1], "ended inside a message (7 bytes left over)"),
        (b"\x00\x00", "ended inside a message (2 bytes left over)"),
    ],
)
def test_unary_body_must_be_exactly_one_message(data: bytes, expected: str) -> None:
    body = MessageAssembler(MIB)
    body.feed(data)
    with pytest.raises(RpcError) as info:
        body.single_message()
    assert info.value.code is StatusCode.INTERNAL
    assert expected in info.value.details


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"plain text", "plain text"),
        (b"100%25 sure", "100% sure"),
        (b"caf%C3%A9 %E2%9C%93", "café ✓"),
        (b"line%0Abreak", "line\nbreak"),
        # Malformed encodings are kept, not dropped (gRPC's rule for clients).
        (b"50%", "50%"),
        (b"%zz%4", "%zz%4"),
        (b"bad %FF byte", "bad \ufffd byte"),
    ],
)
def test_percent_decode(raw: bytes, text: str) -> None:
    assert percent_decode(raw) == text


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"0", StatusCode.OK),
        (b"5", StatusCode.NOT_FOUND),
        (b"14", StatusCode.UNAVAILABLE),
        (b"16", StatusCode.UNAUTHENTICATED),
        (b"17", StatusCode.UNKNOWN),
        (b"-1", StatusCode.UNKNOWN),
        (b"fourteen", StatusCode.UNKNOWN),
        (b"", StatusCode.UNKNOWN),
        (b"\xff", StatusCode.UNKNOWN),
        (b"0" * 5000, StatusCode.UNKNOWN),  # issue 30: int() of it raised ValueError
        (b"\xd9\xa1", StatusCode.UNKNOWN),  # a non-ASCII digit
    ],
)
def test_parse_status(raw: bytes, code: StatusCode) -> None:
    assert parse_status(raw) is code


def test_call_status() -> None:
    assert call_status({b"grpc-status": b"0"}) == (StatusCode.OK, "")
    assert call_status({b"grpc-status": b"2", b"grpc-message": b"no%20space"}) == (
        StatusCode.UNKNOWN,
        "no space",
    )
    assert call_status({b":status": b"200", b"content-type": b"application/grpc"}) is None


@pytest.mark.parametrize(
    ("error_code", "code"),
    [
        (0x0, StatusCode.INTERNAL),  # NO_ERROR before the status: still a broken call
        (0x2, StatusCode.INTERNAL),  # INTERNAL_ERROR
        (0x7, StatusCode.UNAVAILABLE),  # REFUSED_STREAM
        (0x8, StatusCode.CANCELLED),  # CANCEL
        (0xB, StatusCode.RESOURCE_EXHAUSTED),  # ENHANCE_YOUR_CALM
        (0xC, StatusCode.PERMISSION_DENIED),  # INADEQUATE_SECURITY
        (0x99, StatusCode.INTERNAL),
    ],
)
def test_reset_status(error_code: int, code: StatusCode) -> None:
    assert reset_status(error_code) is code


def test_header_map_takes_bytes_or_text_and_keeps_the_last() -> None:
    assert header_map([(b"a", b"1"), ("b", "2"), (b"a", b"3")]) == {b"a": b"3", b"b": b"2"}


OK_HEADERS = {b":status": b"200", b"content-type": b"application/grpc"}


def body_of(*messages: bytes) -> MessageAssembler:
    body = MessageAssembler(MIB)
    for message in messages:
        body.feed(encode_message(message))
    return body


def test_call_result_ok_from_trailers() -> None:
    trailers = {b"grpc-status": b"0"}
    assert call_result(OK_HEADERS, trailers, body_of(b"answer")) == b"answer"


def test_call_result_trailers_only_error() -> None:
    # CRI-O's errors: one HEADERS frame with the status and END_STREAM, no DATA.
    headers = OK_HEADERS | {b"grpc-status": b"5", b"grpc-message": b"image%20not%20known"}
    with pytest.raises(RpcError) as info:
        call_result(headers, None, body_of())
    assert (info.value.code, info.value.details) == (StatusCode.NOT_FOUND, "image not known")


def test_call_result_error_in_trailers_after_data() -> None:
    trailers = {b"grpc-status": b"8", b"grpc-message": b"too%20big"}
    with pytest.raises(RpcError) as info:
        call_result(OK_HEADERS, trailers, body_of(b"partial"))
    assert (info.value.code, info.value.details) == (StatusCode.RESOURCE_EXHAUSTED, "too big")


def test_call_result_trailers_win_over_headers() -> None:
    headers = OK_HEADERS | {b"grpc-status": b"13"}
    assert call_result(headers, {b"grpc-status": b"0"}, body_of(b"x")) == b"x"


def test_call_result_ok_needs_exactly_one_message() -> None:
    with pytest.raises(RpcError) as info:
        call_result(OK_HEADERS, {b"grpc-status": b"0"}, body_of())
    assert info.value.code is StatusCode.INTERNAL


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (b"400", StatusCode.INTERNAL),
        (b"401", StatusCode.UNAUTHENTICATED),
        (b"403", StatusCode.PERMISSION_DENIED),
        (b"404", StatusCode.UNIMPLEMENTED),
        (b"429", StatusCode.UNAVAILABLE),
        (b"502", StatusCode.UNAVAILABLE),
        (b"503", StatusCode.UNAVAILABLE),
        (b"504", StatusCode.UNAVAILABLE),
        (b"500", StatusCode.UNKNOWN),
        (b"nope", StatusCode.UNKNOWN),
        (b"0404", StatusCode.UNKNOWN),
        (b"4" * 5000, StatusCode.UNKNOWN),  # issue 30: int() of it raised ValueError
    ],
)
def test_call_result_http_error_without_grpc_status(status: bytes, code: StatusCode) -> None:
    with pytest.raises(RpcError) as info:
        call_result({b":status": status}, None, body_of())
    assert info.value.code is code
    assert f"HTTP status {status.decode()[:20]}" in info.value.details
    assert len(info.value.details) < 100


def test_call_result_without_any_status() -> None:
    with pytest.raises(RpcError) as info:
        call_result(OK_HEADERS, {b"other": b"x"}, body_of(b"x"))
    assert info.value.code is StatusCode.INTERNAL
    assert "without a grpc-status" in info.value.details
    with pytest.raises(RpcError) as info:
        call_result(None, None, body_of())
    assert "before any response headers" in info.value.details


def test_rpc_error_text() -> None:
    error = RpcError(StatusCode.UNAVAILABLE, "socket gone")
    assert str(error) == "UNAVAILABLE: socket gone"


def frames() -> list[bytes]:
    goaway = GoAwayFrame(0, last_stream_id=7, error_code=0)
    data = DataFrame(1, data=encode_message(b"m" * 100))
    return [
        SettingsFrame(0, settings={SettingsFrame.MAX_CONCURRENT_STREAMS: 100}).serialize(),
        data.serialize(),
        goaway.serialize(),
        PingFrame(0, opaque_data=b"12345678").serialize(),
    ]


@pytest.mark.parametrize("piece", [1, 9, 10, 50, 1000])
def test_take_frames_hands_over_whole_frames_only(piece: int) -> None:
    stream = b"".join(frames())
    buffer = bytearray()
    taken: list[bytes] = []
    for start in range(0, len(stream), piece):
        buffer += stream[start : start + piece]
        taken += take_frames(buffer, 16384)
    assert taken == frames()
    assert buffer == b""


def test_take_frames_keeps_a_partial_frame() -> None:
    first, second = frames()[:2]
    buffer = bytearray(first + second[:-1])
    assert take_frames(buffer, 16384) == [first]
    assert buffer == second[:-1]


def test_take_frames_passes_an_oversized_frame_on_at_once() -> None:
    # A length over the limit goes to h2 as it is (h2 refuses it), not buffered up to 16 MiB.
    huge = (16385).to_bytes(3, "big") + b"\x00\x00\x00\x00\x00\x01" + b"x" * 10
    buffer = bytearray(huge)
    assert take_frames(buffer, 16384) == [huge]
    assert buffer == b""
