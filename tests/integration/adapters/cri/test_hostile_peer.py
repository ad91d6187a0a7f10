"""CriClient against a gRPC server that answers nonsense (grpc-core's server, as in
test_h2_grpc_peer.py): every answer ends in a value or an error of nodeagent's tree with a
clipped message, and the connection goes on serving the next call (issue 13)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
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
