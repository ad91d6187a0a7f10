"""The CRI client's own HTTP/2 transport against the real CRI-O.

Many calls on one connection, flow control both ways (a ListImages answer and a
request far larger than the 64 KiB initial windows), deadlines that expire while
CRI-O works on a pull, and a runtime that stops, dies or is not there: what
grpcio did for the adapter before (docs/decisions/0004-cri-client-over-h2.md).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nodeagent import errors
from nodeagent.adapters.cri.client import CriClient
from nodeagent.ports import RegistryCredentials, StoredImage
from tests.conftest import Pushed
from tests.testenv.crio import Crio
from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.registry import Registry
from tests.testenv.waiting import wait_for_async

ABSENT_DIGEST = "sha256:" + "0" * 64


def connections_opened(client: CriClient) -> int:
    return client._channel.connections_opened


@pytest.fixture
async def silent_registry() -> AsyncIterator[str]:
    """host:port of a loopback listener that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def wait_pull_started(crio: Crio, ref: str) -> None:
    """Until CRI-O logged that it is pulling ``ref``: the call is in flight at the server."""

    async def logged() -> bool:
        return f"Pulling image: {ref}" in crio.log_path.read_text(errors="replace")

    await wait_for_async(logged, timeout_s=20, what=f"CRI-O to start pulling {ref}")


async def test_concurrent_calls_share_one_connection(cri: CriClient, pushed: Pushed) -> None:
    present = pushed.ref(pushed.base_a)
    await cri.pull_image(present)
    absent = f"{pushed.host}/nodeagent-test/never-pushed@{ABSENT_DIGEST}"
    refs = [present if i % 2 else absent for i in range(20)]

    pull, *statuses = await asyncio.gather(
        cri.pull_image(pushed.ref(pushed.base_b)),
        *(cri.image_status(ref) for ref in refs),
    )

    assert isinstance(pull, str)
    assert pull
    for ref, status in zip(refs, statuses, strict=True):
        if ref == present:
            assert isinstance(status, StoredImage)
            assert present in status.repo_digests
        else:
            assert status is None
    assert connections_opened(cri) == 1


async def test_calls_go_on_while_a_pull_waits_and_its_deadline_expires(
    cri: CriClient, crio: Crio, silent_registry: str, pushed: Pushed
) -> None:
    ref = f"{silent_registry}/nodeagent-test/hangs:1"
    started = time.monotonic()
    pull = asyncio.create_task(cri.pull_image(ref, timeout_s=4))
    await wait_pull_started(crio, ref)

    # The pull cannot end before its deadline (its registry never answers), and the
    # other calls on the same connection are not held up behind it.
    statuses = await asyncio.gather(
        *(cri.image_status(pushed.ref(pushed.base_a)) for _ in range(20))
    )
    version = await cri.version()
    assert not pull.done()
    assert len(statuses) == 20
    assert version.runtime_name == "cri-o"

    with pytest.raises(errors.RuntimeTimeout) as info:
        await pull
    elapsed = time.monotonic() - started
    assert 4 <= elapsed < 8
    assert "Deadline Exceeded" in str(info.value)
    # The stream was cancelled, the connection goes on.
    assert (await cri.version()).runtime_name == "cri-o"
    assert connections_opened(cri) == 1


async def test_list_images_answer_larger_than_the_flow_control_window(
    fresh_crio: Crio, registry: Registry
) -> None:
    # One small image under many long names: each repository adds a repo tag and a
    # repo digest to the image's entry in the ListImages answer. Names of about 240
    # characters (the limit is 255, host included) with tags of 123 (limit 128).
    image = TestImage("nodeagent-test/names", [LayerSpec(1024, seed=77)]).build()
    tag = "t" * 123
    repositories = [f"nodeagent-test/{'n' * 200}-{r:03d}" for r in range(128)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(
            pool.map(
                lambda repository: push(registry.url, repository, image, tag=tag), repositories
            )
        )
    refs = [f"{registry.host}/{repository}:{tag}" for repository in repositories]

    async with CriClient(fresh_crio.endpoint, timeout_s=60) as client:
        at_once = asyncio.Semaphore(8)

        async def pull(ref: str) -> None:
            async with at_once:
                await client.pull_image(ref)

        await asyncio.gather(*(pull(ref) for ref in refs))
        images = await client.list_images()
        assert connections_opened(client) == 1

    names = [name for stored in images for name in stored.names()]
    assert set(refs) <= set(names)
    # The names alone are more than the 64 KiB both initial windows allow.
    assert sum(len(name) for name in names) > 72 * 1024


async def test_request_larger_than_the_flow_control_window(cri: CriClient, pushed: Pushed) -> None:
    # A 1 MiB password: CRI-O reads the whole request (16 times its initial window)
    # before it asks the registry, which does not know the digest.
    credentials = RegistryCredentials(
        server_address=pushed.host, username="u", password="p" * 2**20
    )
    ref = f"{pushed.host}/nodeagent-test/app-a@{ABSENT_DIGEST}"
    with pytest.raises(errors.ImageNotFound) as info:
        await cri.pull_image(ref, credentials)
    assert "manifest unknown" in str(info.value)
    assert connections_opened(cri) == 1


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_runtime_gone_mid_call_fails_the_call_then_the_client_reconnects(
    fresh_crio: Crio, silent_registry: str, how: str
) -> None:
    ref = f"{silent_registry}/nodeagent-test/hangs:1"
    async with CriClient(fresh_crio.endpoint, timeout_s=60) as client:
        assert (await client.version()).runtime_name == "cri-o"
        pull = asyncio.create_task(client.pull_image(ref, timeout_s=60))
        await wait_pull_started(fresh_crio, ref)
        started = time.monotonic()
        # SIGTERM: CRI-O says GOAWAY and goes; SIGKILL: the socket just ends.
        await asyncio.to_thread(fresh_crio.stop if how == "stop" else fresh_crio.kill)
        with pytest.raises(errors.RuntimeUnreachable):
            await pull
        assert time.monotonic() - started < 20

        # Down: every call fails at once (a stale socket file is refused, a removed one
        # is missing), nothing waits for the runtime to come back.
        started = time.monotonic()
        with pytest.raises(errors.RuntimeUnreachable):
            await client.version()
        assert time.monotonic() - started < 2

        fresh_crio.start()
        assert (await client.version()).runtime_name == "cri-o"
        assert connections_opened(client) == 2


async def test_socket_nobody_listens_on_is_unreachable_at_once(tmp_path: Path) -> None:
    # What a crashed runtime leaves: the socket file, no listener.
    path = tmp_path / "stale.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()
    started = time.monotonic()
    async with CriClient(f"unix://{path}", timeout_s=30) as client:
        with pytest.raises(errors.RuntimeUnreachable) as info:
            await client.list_images()
        assert connections_opened(client) == 0
    assert time.monotonic() - started < 2
    assert "stale.sock" in str(info.value)
    assert "refused" in str(info.value).lower()
