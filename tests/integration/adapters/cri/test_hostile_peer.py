"""CriClient against a gRPC server that answers nonsense (grpc-core's server, as in
test_h2_grpc_peer.py): every answer ends in a value or an error of nodeagent's tree with a
clipped message, and the connection goes on serving the next call (issue 13)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest

from nodeagent.adapters.cri.api import runtime_v1_pb2 as pb
from nodeagent.adapters.cri.client import CriClient
from nodeagent.errors import ImageNotFound, NodeAgentError, RuntimeCallFailed, RuntimeUnreachable

Handler = Callable[[bytes, grpc.ServicerContext], bytes]
ESCAPES = "\x1b]0;owned\x07\x1b[2J"


class Answers:
    """What the peer answers next, per method (serialized protobuf, or an abort text)."""

    def __init__(self) -> None:
        self.by_method: dict[str, bytes | str] = {}

    def handler(self, method: str) -> Handler:
        def answer(_request: bytes, context: grpc.ServicerContext) -> bytes:
            value = self.by_method.get(method, b"")
            if isinstance(value, str):
                context.abort(grpc.StatusCode.UNKNOWN, value)
            return value

        return answer


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[tuple[Answers, Path]]:
    answers = Answers()
    services = {
        "runtime.v1.ImageService": ("ListImages", "ImageFsInfo", "ImageStatus", "PullImage"),
        "runtime.v1.RuntimeService": ("Version",),
    }
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                service,
                {m: grpc.unary_unary_rpc_method_handler(answers.handler(m)) for m in methods},
            )
            for service, methods in services.items()
        ]
    )
    socket = tmp_path / "hostile.sock"
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    try:
        yield answers, socket
    finally:
        server.stop(grace=None)


def image(**fields: object) -> pb.Image:
    values: dict[str, object] = {"id": "f" * 64, "repo_tags": ["quay.io/a/b:1"], "size": 1}
    return pb.Image(**(values | fields))  # type: ignore[arg-type]  # protobuf's kwargs


NONSENSE = [
    ("ListImages", pb.ListImagesResponse(images=[image(size=2**64 - 1)]), "image size"),
    ("ListImages", pb.ListImagesResponse(images=[image(repo_tags=["a\n" + ESCAPES])]), "tag"),
    (
        "ImageFsInfo",
        pb.ImageFsInfoResponse(
            image_filesystems=[
                pb.FilesystemUsage(fs_id=pb.FilesystemIdentifier(mountpoint="x" + ESCAPES))
            ]
        ),
        "mountpoint",
    ),
    ("ImageStatus", pb.ImageStatusResponse(image=image(repo_digests=["x@"])), "repo digest"),
    ("PullImage", pb.PullImageResponse(image_ref="a b" + ESCAPES), "image reference"),
]


async def call(cri: CriClient, method: str) -> object:
    if method == "ListImages":
        return await cri.list_images()
    if method == "ImageFsInfo":
        return await cri.image_fs_info()
    if method == "ImageStatus":
        return await cri.image_status("quay.io/a/b:1")
    if method == "PullImage":
        return await cri.pull_image("quay.io/a/b:1")
    return await cri.version()


@pytest.mark.parametrize(("method", "answer", "fragment"), NONSENSE)
async def test_a_nonsense_answer_is_runtime_call_failed_and_the_next_call_works(
    peer: tuple[Answers, Path], method: str, answer: pb.Image, fragment: str
) -> None:
    answers, socket = peer
    answers.by_method[method] = answer.SerializeToString()
    answers.by_method["Version"] = pb.VersionResponse(runtime_name="cri-o").SerializeToString()
    async with CriClient(f"unix://{socket}", timeout_s=10) as cri:
        with pytest.raises(RuntimeCallFailed) as caught:
            await call(cri, method)
        assert fragment in caught.value.message
        assert "\x1b" not in caught.value.message
        assert len(caught.value.message) < 500
        assert (await cri.version()).runtime_name == "cri-o"


async def test_version_strings_are_clipped_and_escaped(peer: tuple[Answers, Path]) -> None:
    answers, socket = peer
    answers.by_method["Version"] = pb.VersionResponse(
        runtime_name="cri-o" + ESCAPES, runtime_version="1." * 50_000
    ).SerializeToString()
    async with CriClient(f"unix://{socket}", timeout_s=10) as cri:
        version = await cri.version()
    assert "\x1b" not in version.runtime_name
    assert len(version.runtime_version) < 300


@pytest.mark.parametrize(
    ("size", "expected"), [(10_000, ImageNotFound), (200_000, RuntimeUnreachable)]
)
async def test_a_long_error_text_is_clipped_or_refused_never_raised_raw(
    peer: tuple[Answers, Path], size: int, expected: type[NodeAgentError]
) -> None:
    """10 kB fits the 64 KiB header bound: classified whole, then clipped. 200 kB is over
    it: h2 refuses the header block, the connection is dropped (RuntimeUnreachable) and the
    client connects again for the next call."""
    answers, socket = peer
    answers.by_method["ListImages"] = "manifest unknown " + ESCAPES + "x" * size
    answers.by_method["Version"] = pb.VersionResponse(runtime_name="cri-o").SerializeToString()
    async with CriClient(f"unix://{socket}", timeout_s=10) as cri:
        with pytest.raises(NodeAgentError) as caught:
            await cri.list_images()
        assert type(caught.value) is expected
        assert "\x1b" not in caught.value.message
        assert len(caught.value.message) < 600
        assert (await cri.version()).runtime_name == "cri-o"


# ---------------------------------------------------------------- a peer below gRPC
class RawPeer:
    """An HTTP/2 server on a unix socket, written with h2 itself: it answers the first call
    with ``first`` (a header list, the stream then ended) and every later one as a gRPC
    server would (``VersionResponse(runtime_name="cri-o")``). grpc-core cannot send a
    ``:status`` that is not a status, a hostile runtime (or anything on the socket) can."""

    def __init__(self, first: list[tuple[bytes, bytes]]) -> None:
        self.first = first
        self.calls = 0
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        config = h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_outbound_headers=False
        )
        conn = h2.connection.H2Connection(config)
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.StreamEnded):
                        self._answer(conn, event.stream_id)
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, h2.exceptions.H2Error):
            pass
        finally:
            writer.close()

    def _answer(self, conn: h2.connection.H2Connection, stream_id: int) -> None:
        self.calls += 1
        if self.calls == 1:
            conn.send_headers(stream_id, self.first, end_stream=True)
            return
        message = pb.VersionResponse(runtime_name="cri-o").SerializeToString()
        conn.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        conn.send_data(stream_id, b"\x00" + len(message).to_bytes(4, "big") + message)
        conn.send_headers(stream_id, [(b"grpc-status", b"0")], end_stream=True)


@pytest.mark.parametrize(
    "first",
    [
        [(b":status", b"2" * 5000)],  # issue 30: int() raised ValueError in the reader task
        [(b":status", b"200"), (b"grpc-status", b"9" * 5000)],
        [(b":status", b"0" * 4301), (b"grpc-status", b"0" * 4301)],
    ],
    ids=["status-5000-digits", "grpc-status-5000-digits", "both-4301-zeros"],
)
async def test_a_status_of_thousands_of_digits_fails_the_call_not_the_connection(
    tmp_path: Path, first: list[tuple[bytes, bytes]]
) -> None:
    peer = RawPeer(first)
    socket = tmp_path / "raw.sock"
    server = await asyncio.start_unix_server(peer.serve, path=str(socket))
    stray: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: stray.append(context))
    try:
        async with CriClient(f"unix://{socket}", timeout_s=10) as cri:
            with pytest.raises(RuntimeCallFailed) as caught:
                await cri.version()
            assert len(caught.value.message) < 300
            assert (await cri.version()).runtime_name == "cri-o"  # the same connection
    finally:
        server.close()
        await server.wait_closed()
    assert (peer.calls, peer.connections) == (2, 1)
    assert stray == []  # no task died with an exception nobody handled
