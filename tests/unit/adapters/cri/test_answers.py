"""Nonsense CRI answers become RuntimeCallFailed with a clipped message (issue 13)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nodeagent.adapters.cri import answers
from nodeagent.adapters.cri.api import runtime_v1_pb2 as pb
from nodeagent.adapters.cri.client import MAX_MESSAGE_BYTES, CriClient
from nodeagent.adapters.cri.wire import MessageAssembler, RpcError, StatusCode
from nodeagent.errors import ImageNotFound, RuntimeCallFailed

DIGEST = "quay.io/a/b@sha256:" + "ab" * 32
UINT64_MAX = 2**64 - 1


def image(**fields: object) -> pb.Image:
    values: dict[str, object] = {
        "id": "f" * 64,
        "repo_tags": ["quay.io/a/b:1"],
        "repo_digests": [DIGEST],
        "size": 1234,
    }
    values.update(fields)
    return pb.Image(**values)  # type: ignore[arg-type]  # protobuf's generated kwargs


def fs_usage(mountpoint: str, used: int = 1, inodes: int = 1) -> pb.FilesystemUsage:
    return pb.FilesystemUsage(
        fs_id=pb.FilesystemIdentifier(mountpoint=mountpoint),
        used_bytes=pb.UInt64Value(value=used),
        inodes_used=pb.UInt64Value(value=inodes),
    )


def test_a_sane_image_converts() -> None:
    stored = answers.stored_image(image(size=answers.MAX_IMAGE_BYTES, pinned=True))
    assert (stored.size_bytes, stored.is_pinned) == (2**50, True)
    assert stored.names() == ("quay.io/a/b:1", DIGEST)


NONSENSE_IMAGES = [
    (image(size=UINT64_MAX), "image size 18446744073709551615 is not between 0 and"),
    (image(size=2**63), "image size"),
    (image(size=answers.MAX_IMAGE_BYTES + 1), "image size"),
    (image(repo_tags=["quay.io/a/b:1\n\x1b[2J"]), "repo tag 'quay.io/a/b:1\\x0a\\x1b[2J'"),
    (image(repo_tags=["x" * 10_000_000]), "…("),
    (image(repo_tags=["with space:1"]), "is not an image name"),
    (image(repo_tags=[""]), "is not an image name"),
    (image(repo_digests=["quay.io/a/b:1"]), "repo digest"),
    (image(repo_digests=["quay.io/a/b@sha256:"]), "repo digest"),
    (image(repo_tags=["a:1"] * (answers.MAX_NAMES + 1)), "names"),
    (image(id="i" * 10_000), "image id of 10000 characters"),
]


@pytest.mark.parametrize(("msg", "fragment"), NONSENSE_IMAGES)
def test_a_nonsense_image_is_runtime_call_failed(msg: pb.Image, fragment: str) -> None:
    with pytest.raises(RuntimeCallFailed) as caught:
        answers.stored_image(msg)
    assert fragment in caught.value.message
    assert caught.value.message.startswith("ListImages: the runtime answered nonsense: ")
    assert len(caught.value.message) < 400
    assert "\x1b" not in caught.value.message


def test_too_many_images_are_refused() -> None:
    msg = pb.ListImagesResponse(images=[pb.Image(id="a")] * (answers.MAX_IMAGES + 1))
    with pytest.raises(RuntimeCallFailed, match="100001 images"):
        answers.stored_images(msg)


@pytest.mark.parametrize(
    ("usage", "fragment"),
    [
        (fs_usage("relative/dir"), "is not an absolute path"),
        (fs_usage(""), "is not an absolute path"),
        (fs_usage("/var/lib\x00/x"), "'/var/lib\\x00/x'"),
        (fs_usage("/" + "d" * 5000), "is not an absolute path"),
        (fs_usage("/var", used=UINT64_MAX), "used bytes 18446744073709551615"),
        (fs_usage("/var", inodes=2**63), "used inodes"),
    ],
)
def test_a_nonsense_image_filesystem_is_refused(usage: pb.FilesystemUsage, fragment: str) -> None:
    with pytest.raises(RuntimeCallFailed) as caught:
        answers.filesystem_usages(pb.ImageFsInfoResponse(image_filesystems=[usage]))
    assert fragment in caught.value.message
    assert len(caught.value.message) < 400


def test_too_many_image_filesystems_are_refused() -> None:
    many = [fs_usage(f"/fs{i}") for i in range(answers.MAX_FILESYSTEMS + 1)]
    with pytest.raises(RuntimeCallFailed, match="65 image filesystems"):
        answers.filesystem_usages(pb.ImageFsInfoResponse(image_filesystems=many))


def test_a_sane_image_filesystem_converts() -> None:
    usages = answers.filesystem_usages(
        pb.ImageFsInfoResponse(image_filesystems=[fs_usage("/var/lib/containers", 2**62, 7)])
    )
    assert [(u.mountpoint, u.used_bytes, u.inodes_used) for u in usages] == [
        ("/var/lib/containers", 2**62, 7)
    ]


def test_version_strings_are_clipped_and_escaped() -> None:
    version = answers.runtime_version(
        pb.VersionResponse(runtime_name="cri-o\x1b[31m", runtime_version="1.34.0" + "9" * 100_000)
    )
    assert version.runtime_name == "cri-o\\x1b[31m"
    assert len(version.runtime_version) < 300
    assert version.runtime_version.startswith("1.34.0999")


def test_a_pulled_image_ref_is_bounded() -> None:
    assert answers.image_ref("PullImage", DIGEST) == DIGEST
    with pytest.raises(RuntimeCallFailed, match="image reference"):
        answers.image_ref("PullImage", "a\nb")


# ---------------------------------------------------------------- through the client
class CannedChannel:
    """Stands in for the h2 channel: one canned answer (bytes) or failure per call."""

    def __init__(self, answer: bytes | RpcError) -> None:
        self.answer = answer

    async def unary(self, method: str, request: bytes, *, timeout_s: float) -> bytes:
        if isinstance(self.answer, RpcError):
            raise self.answer
        return self.answer

    async def close(self) -> None:
        return None


def client(answer: bytes | RpcError) -> CriClient:
    cri = CriClient("unix:///run/test.sock")
    cri._channel = CannedChannel(answer)  # type: ignore[assignment]  # test double
    return cri


def nested(depth: int) -> bytes:
    """A protobuf message nested ``depth`` deep (field 1 of Image's unknown fields)."""
    data = b""
    for _ in range(depth):
        data = b"\x0a" + _varint(len(data)) + data
    return data


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


CALLS: list[tuple[str, Callable[[CriClient], object]]] = [
    ("ListImages", lambda c: c.list_images()),
    ("ImageFsInfo", lambda c: c.image_fs_info()),
    ("Version", lambda c: c.version()),
    ("ImageStatus", lambda c: c.image_status("quay.io/a/b:1")),
]


@pytest.mark.parametrize(
    "answer",
    [
        pb.ListImagesResponse(images=[image(size=UINT64_MAX)]).SerializeToString(),
        pb.ImageFsInfoResponse(image_filesystems=[fs_usage("x")]).SerializeToString(),
        pb.ImageStatusResponse(image=image(repo_digests=["nope"])).SerializeToString(),
        b"\xff\xff\xff",
        nested(20_000),
    ],
)
@pytest.mark.parametrize(("name", "call"), CALLS)
async def test_no_answer_raises_anything_but_the_error_tree(
    answer: bytes, name: str, call: Callable[[CriClient], object]
) -> None:
    try:
        await call(client(answer))  # type: ignore[misc]  # each lambda returns a coroutine
    except RuntimeCallFailed as exc:
        assert len(exc.message) < 500
    # an answer that happens to decode as another message's sane value is fine too


async def test_a_huge_error_text_is_classified_then_clipped() -> None:
    details = "reading manifest: manifest unknown " + "\x1b[2J" + "x" * 10_000_000
    with pytest.raises(ImageNotFound) as caught:
        await client(RpcError(StatusCode.UNKNOWN, details)).list_images()
    assert len(caught.value.message) < 600
    assert "\x1b" not in caught.value.message


def test_the_message_bound_is_enforced_as_the_prefix_arrives() -> None:
    assembler = MessageAssembler(MAX_MESSAGE_BYTES)
    with pytest.raises(RpcError, match="over the limit of 67108864 bytes"):
        assembler.feed(b"\x00" + (MAX_MESSAGE_BYTES + 1).to_bytes(4, "big"))


def test_running_containers_are_checked_and_their_pod_labels_kept() -> None:
    ok = pb.Container(
        id="c1",
        metadata=pb.ContainerMetadata(name="app\x1b[2J"),
        image=pb.ImageSpec(image="quay.example.com/a:1"),
        image_ref="sha256:" + "a" * 64,
        labels={"io.kubernetes.pod.name": "web", "io.kubernetes.pod.namespace": "ns"},
    )
    (found,) = answers.running_containers(pb.ListContainersResponse(containers=[ok]))
    assert (found.pod_namespace, found.pod_name, found.image) == (
        "ns",
        "web",
        "quay.example.com/a:1",
    )
    assert "\x1b" not in found.name
    huge = pb.Container(id="c2", image=pb.ImageSpec(image="x" * 5000))
    with pytest.raises(RuntimeCallFailed):
        answers.running_containers(pb.ListContainersResponse(containers=[huge]))
