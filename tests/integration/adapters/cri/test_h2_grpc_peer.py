"""The h2 gRPC client against grpc-core's server, for what CRI-O cannot be made to do.

CRI-O sets no stream limit and its answers are small; grpcio's server (a second,
independent gRPC implementation, installed for ``make proto`` anyway) can be told
to allow two streams, to answer with more than the client accepts, and to put
any text in ``grpc-message``. The client speaks raw bytes here (no protobuf).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from nodeagent.adapters.cri.h2 import Channel
from nodeagent.adapters.cri.wire import RpcError, StatusCode
from tests.testenv.waiting import wait_for

SERVICE = "nodeagent.test.Peer"
STREAM_LIMIT = 2
MIB = 1024 * 1024


@dataclass
class Peer:
    """A grpcio server on a unix socket; ``Hold`` waits for ``release`` per call."""

    socket: Path
    release: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    most_in_flight: int = 0
    finished: int = 0

    def hold(self, request: bytes, _context: grpc.ServicerContext) -> bytes:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.release.acquire(timeout=30)
        with self.lock:
            self.in_flight -= 1
            self.finished += 1
        return request

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.in_flight, self.finished


def fail(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.abort(grpc.StatusCode.FAILED_PRECONDITION, request.decode())
    raise AssertionError("abort returns no more")


def echo_times(request: bytes, _context: grpc.ServicerContext) -> bytes:
    return request * 4


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[Peer]:
    peer = Peer(tmp_path / "peer.sock")
    handlers: dict[str, Callable[[bytes, grpc.ServicerContext], bytes]] = {
        "Hold": peer.hold,
        "Fail": fail,
        "EchoTimesFour": echo_times,
    }
    server = grpc.server(
        ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_concurrent_streams", STREAM_LIMIT)],
    )
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                SERVICE,
                {name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in handlers.items()},
            )
        ]
    )
    server.add_insecure_port(f"unix:{peer.socket}")
    server.start()
    try:
        yield peer
    finally:
        for _ in range(16):
            peer.release.release()
        server.stop(grace=None)


async def test_calls_beyond_the_stream_limit_wait_for_a_free_stream(peer: Peer) -> None:
    channel = Channel(str(peer.socket), max_message_bytes=MIB)
    calls = [
        asyncio.create_task(channel.unary(f"/{SERVICE}/Hold", b"%d" % i, timeout_s=30))
        for i in range(6)
    ]
    try:
        for finished in range(6):
            # Two in the server, the rest queued in the client (the server would refuse
            # them): no call has an answer the server did not give. Which callers get a
            # free stream first is not promised (nor by grpcio).
            expected = (min(STREAM_LIMIT, 6 - finished), finished)
            await asyncio.to_thread(
                wait_for, lambda e=expected: peer.counts() == e, timeout_s=10, what=f"{expected}"
            )
            assert sum(call.done() for call in calls) <= finished
            peer.release.release()
        results = await asyncio.gather(*calls)
    finally:
        await channel.close()
    assert results == [b"%d" % i for i in range(6)]
    assert peer.most_in_flight == STREAM_LIMIT
    assert channel.connections_opened == 1


@pytest.mark.parametrize("text", ["plain", "100% sûr ✓\nsecond line", "%41 stays %41", "é" * 2000])
async def test_status_message_survives_grpc_cores_percent_encoding(peer: Peer, text: str) -> None:
    channel = Channel(str(peer.socket), max_message_bytes=MIB)
    try:
        with pytest.raises(RpcError) as info:
            await channel.unary(f"/{SERVICE}/Fail", text.encode(), timeout_s=10)
    finally:
        await channel.close()
    assert info.value.code is StatusCode.FAILED_PRECONDITION
    assert info.value.details == text


async def test_answer_over_the_limit_fails_that_call_only(peer: Peer) -> None:
    channel = Channel(str(peer.socket), max_message_bytes=MIB)
    try:
        with pytest.raises(RpcError) as info:
            await channel.unary(f"/{SERVICE}/EchoTimesFour", b"x" * (MIB // 2), timeout_s=10)
        assert info.value.code is StatusCode.RESOURCE_EXHAUSTED
        assert f"of {2 * MIB} bytes is over the limit of {MIB} bytes" in info.value.details

        # The same connection carries the next call; an answer of exactly the limit is fine.
        request = b"y" * (MIB // 4)
        assert (
            await channel.unary(f"/{SERVICE}/EchoTimesFour", request, timeout_s=10) == request * 4
        )
        assert channel.connections_opened == 1
    finally:
        await channel.close()


async def test_unknown_method_is_unimplemented(peer: Peer) -> None:
    channel = Channel(str(peer.socket), max_message_bytes=MIB)
    try:
        with pytest.raises(RpcError) as info:
            await channel.unary(f"/{SERVICE}/Nope", b"", timeout_s=10)
    finally:
        await channel.close()
    assert info.value.code is StatusCode.UNIMPLEMENTED


async def test_closed_channel_refuses_calls(peer: Peer) -> None:
    channel = Channel(str(peer.socket), max_message_bytes=MIB)
    assert await channel.unary(f"/{SERVICE}/EchoTimesFour", b"a", timeout_s=10) == b"aaaa"
    await channel.close()
    with pytest.raises(RpcError) as info:
        await channel.unary(f"/{SERVICE}/EchoTimesFour", b"a", timeout_s=10)
    assert info.value.code is StatusCode.CANCELLED
