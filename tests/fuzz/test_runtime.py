"""Fuzz: what the runtime side hands nodeagent: other components' CRI-O drop-ins
(``pins.foreign_pins``, ``crio_config.staging_dir_of``) and CRI answers (the gRPC wire
rules in ``adapters.cri.wire`` and their conversion to nodeagent types in
``adapters.cri.client``).

Contract: drop-ins never raise (a file CRI-O cannot read is listed as unreadable); a CRI
answer is a nodeagent value or a ``NodeAgentError`` with a clipped message; the wire layer
raises only ``RpcError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.adapters.cri.api import runtime_v1_pb2 as pb
from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.cri.wire import MessageAssembler, RpcError, StatusCode, call_result
from nodeagent.adapters.crio_config import staging_dir_of
from nodeagent.pins import ConfigFile, ForeignPins, foreign_pins
from tests.fuzz import strategies as s
from tests.fuzz.contract import outcome

_DROPINS = [
    '[crio.image]\npinned_images = ["quay.io/app*", "*keyword*"]\n',
    '[crio.image]\nbig_files_temporary_dir = "/var/lib/staging"\n',
    '[crio]\n[crio.image]\npinned_images = []\n[crio.runtime]\nlog_level = "info"\n',
    'crio = 1\n', '[crio]\nimage = "x"\n', '[crio.image]\npinned_images = "a"\n',
]  # fmt: skip
dropins = st.one_of(
    s.text,
    s.edited_text(_DROPINS),
    s.deep("a = [", "]", st.integers(30, 5000)),
    s.deep("a = {b = ", "}", st.integers(30, 5000)),
    st.builds(lambda n: "a = " + "9" * n, st.integers(4000, 5000)),
)


def _files(texts: list[str]) -> list[ConfigFile]:
    return [ConfigFile(f"/etc/crio/crio.conf.d/{i:02d}.conf", t, i % 2 == 0) for i, t in
            enumerate(texts)]  # fmt: skip


@given(st.lists(s.edited_text(_DROPINS), max_size=4))
def test_foreign_pins_documents(texts: list[str]) -> None:
    files = _files(texts)
    result = outcome("pins.foreign_pins", lambda: foreign_pins(files), allowed=())
    assert isinstance(result, ForeignPins)
    outcome("crio_config.staging_dir_of", lambda: staging_dir_of(files), allowed=())


@given(st.lists(dropins, max_size=4))
@example(["a = " + "[" * 5000 + "]" * 5000])
@example(["a = " + "9" * 4301])
def test_foreign_pins(texts: list[str]) -> None:
    files = _files(texts)
    result = outcome("pins.foreign_pins", lambda: foreign_pins(files), allowed=())
    assert isinstance(result, ForeignPins)
    outcome("crio_config.staging_dir_of", lambda: staging_dir_of(files), allowed=())


# ---------------------------------------------------------------- CRI answers
headers = st.dictionaries(
    st.sampled_from([b":status", b"grpc-status", b"grpc-message", b"content-type"]),
    st.one_of(st.binary(max_size=40), st.sampled_from([b"200", b"0", b"14", b"99", b"%zz%C3"])),
)


@given(
    st.one_of(st.none(), headers),
    st.one_of(st.none(), headers),
    st.lists(st.binary(max_size=64), max_size=4),
)
def test_wire_call_result(
    head: dict[bytes, bytes] | None, tail: dict[bytes, bytes] | None, chunks: list[bytes]
) -> None:
    def call() -> bytes:
        body = MessageAssembler(max_bytes=1024)
        for chunk in chunks:
            body.feed(chunk)
        return call_result(head, tail, body)

    # RpcError's text reaches a person only inside the client's NodeAgentError (test_cri_error)
    outcome("cri.wire call_result", call, allowed=(RpcError,), is_message_shown=False)


class _Channel:
    """Stands in for the h2 channel: answers every call with ``answer``."""

    def __init__(self, answer: bytes | RpcError) -> None:
        self.answer = answer

    async def unary(self, method: str, request: bytes, *, timeout_s: float) -> bytes:
        if isinstance(self.answer, RpcError):
            raise self.answer
        return self.answer

    async def close(self) -> None:
        return None


def _image(fields: dict[str, Any]) -> Any:
    return pb.Image(**fields)


images = st.builds(
    lambda id_, tags, digests, size, pinned: pb.Image(
        id=id_, repo_tags=tags, repo_digests=digests, size=size, pinned=pinned
    ),
    s.text.filter(lambda t: t.encode("utf-8", "surrogatepass") == t.encode("utf-8", "replace")),
    st.lists(s.words.filter(str.isprintable), max_size=3),
    st.lists(s.words.filter(str.isprintable), max_size=3),
    st.integers(0, 2**64 - 1),
    st.booleans(),
)
answers = st.one_of(
    s.raw_bytes,
    s.mutated(st.lists(images, max_size=3).map(
        lambda found: pb.ListImagesResponse(images=found).SerializeToString())),
    s.mutated(images.map(lambda found: pb.ImageStatusResponse(image=found).SerializeToString())),
)  # fmt: skip
errors = st.builds(RpcError, st.sampled_from(list(StatusCode)), s.text)

_CALLS: list[tuple[str, Callable[[CriClient], Awaitable[object]]]] = [
    ("version", lambda c: c.version()),
    ("list_images", lambda c: c.list_images()),
    ("image_status", lambda c: c.image_status("quay.io/app@sha256:" + "0" * 64)),
    ("pull_image", lambda c: c.pull_image("quay.io/app@sha256:" + "0" * 64)),
    ("image_fs_info", lambda c: c.image_fs_info()),
    ("remove_image", lambda c: c.remove_image("quay.io/app@sha256:" + "0" * 64)),
]


def _answer(answer: bytes | RpcError, call: Callable[[CriClient], Awaitable[object]]) -> None:
    client = CriClient("unix:///run/fuzz/crio.sock")
    client._channel = _Channel(answer)  # type: ignore[assignment]  # the fuzzed runtime
    outcome("cri.CriClient answers", lambda: asyncio.run(call(client)))  # type: ignore[arg-type]


@given(answers, st.sampled_from(_CALLS))
def test_cri_answer(
    answer: bytes, call: tuple[str, Callable[[CriClient], Awaitable[object]]]
) -> None:
    _answer(answer, call[1])


@given(errors, st.sampled_from(_CALLS))
@example(RpcError(StatusCode.UNKNOWN, "pull failed: \x1b[2J" + "x" * 5000), _CALLS[3])
def test_cri_error(
    answer: RpcError, call: tuple[str, Callable[[CriClient], Awaitable[object]]]
) -> None:
    _answer(answer, call[1])
