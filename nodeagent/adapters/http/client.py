"""The fetcher's side of the peer protocol (docs/site.md): HTTPS with mutual TLS, to one peer
at a time per request.

The node presents ``[site] client_cert_file``/``client_key_file`` and checks the peer's
certificate against ``ca_file`` and the address asked (an IP SAN;
``tls.ReloadingClientTls``, re-read when the files are rotated). Every answer is bounded:
the JSON documents and the signed manifest by their format's limits, a blob by the bytes
still missing of it. ``request_timeout_s`` is a no-progress timeout (connecting, then each
read), never one on a whole transfer. Failures are typed: ``PeerBusy`` for 429/503 with
the peer's ``Retry-After`` (parsed strictly), ``PeerUnreachable`` for everything the
network or the peer got wrong, ``PeerAnswerInvalid`` for documents that fail their parse.
No redirect is followed and nothing is decompressed.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Final

import aiohttp

from nodeagent.adapters.http.tls import ReloadingClientTls
from nodeagent.errors import PeerAnswerInvalid, PeerBusy, PeerUnreachable
from nodeagent.site.holdings import (
    MAX_HAVE_BYTES,
    MAX_HOLDINGS_BYTES,
    Have,
    Holdings,
    parse_have,
    parse_holdings,
)
from nodeagent.site.routes import HOLDINGS_PATH
from nodeagent.strict import clip
from nodeagent.strict.http import parse_retry_after

CHUNK_BYTES: Final = 1 << 20
"""A blob is handed on in steps of this size (the last one shorter)."""
REPOSITORY: Final = "nodeagent/store"
"""The repository name in blob URLs (checked by the server, otherwise ignored)."""
MAX_ERROR_BODY: Final = 4 << 10

WriteChunk = Callable[[bytes], Awaitable[None]]


class PeerClient:
    """Requests to peers; one connection pool, closed with ``close``."""

    def __init__(self, tls: ReloadingClientTls, *, request_timeout_s: float) -> None:
        self._tls = tls
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=request_timeout_s, sock_read=request_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        self.bytes_received = 0
        """Blob bytes received from peers since start."""

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                auto_decompress=False,
                connector=aiohttp.TCPConnector(limit=64, limit_per_host=4),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------ documents
    async def holdings(self, address: str) -> Holdings:
        return parse_holdings(await self._small(address, HOLDINGS_PATH, MAX_HOLDINGS_BYTES))

    async def have(self, address: str, bundle_id: str) -> Have:
        path = f"/nodeagent/v1/bundles/{bundle_id}/have"
        return parse_have(await self._small(address, path, MAX_HAVE_BYTES))

    async def bundle_file(self, address: str, bundle_id: str, name: str, max_bytes: int) -> bytes:
        """``bundle.json`` or its signature, as the peer stores them (verified by the caller)."""
        return await self._small(address, f"/nodeagent/v1/bundles/{bundle_id}/{name}", max_bytes)

    async def _small(self, address: str, path: str, max_bytes: int) -> bytes:
        async with self._request(address, path, {}) as response:
            await _check_status(address, response, (200,))
            if (response.content_length or 0) > max_bytes:
                raise PeerAnswerInvalid(f"peer {address}: {path} is over {max_bytes} bytes")
            return await _read_at_most(address, response, max_bytes)

    # ------------------------------------------------------------ blobs
    async def blob(
        self, address: str, digest: str, *, offset: int, size_bytes: int, write: WriteChunk
    ) -> int:
        """Bytes ``offset`` to the end of the blob, handed to ``write`` in steps; the bytes
        received. More than the blob's size, or a range other than asked, is refused."""
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        path = f"/v2/{REPOSITORY}/blobs/{digest}"
        left = size_bytes - offset
        async with self._request(address, path, headers) as response:
            await _check_status(address, response, (206,) if offset else (200,))
            if offset:
                _check_range(address, response, offset, size_bytes)
            if response.content_length is not None and response.content_length != left:
                raise PeerUnreachable(
                    f"peer {address} announced {response.content_length} bytes for {digest} "
                    f"where {left} were asked"
                )
            received = 0
            while received < left:
                chunk = await _read_step(address, response, min(CHUNK_BYTES, left - received))
                received += len(chunk)
                self.bytes_received += len(chunk)
                await write(chunk)
            if await response.content.read(1):
                raise PeerUnreachable(f"peer {address} sent more than the {size_bytes} bytes")
        return received

    # ------------------------------------------------------------ plumbing
    def _request(self, address: str, path: str, headers: dict[str, str]) -> _Answer:
        return _Answer(self, address, path, headers)

    def url(self, address: str, path: str) -> str:
        return f"https://{address}{path}"

    def context(self) -> ssl.SSLContext:
        return self._tls.context

    def session(self) -> aiohttp.ClientSession:
        return self._open()


class _Answer:
    """``async with`` one GET, its connection errors typed as ``PeerUnreachable``."""

    def __init__(self, client: PeerClient, address: str, path: str, headers: dict[str, str]):
        self._client, self._address, self._path = client, address, path
        self._headers = {"Accept-Encoding": "identity", **headers}
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        try:
            self._response = await self._client.session().get(
                self._client.url(self._address, self._path),
                headers=self._headers,
                ssl=self._client.context(),
                allow_redirects=False,
            )
        except (aiohttp.ClientError, OSError, TimeoutError, ssl.SSLError) as err:
            raise _unreachable(self._address, err) from err
        return self._response

    async def __aexit__(self, *exc_info: object) -> None:
        if self._response is not None:
            self._response.release()


def _unreachable(address: str, err: BaseException) -> PeerUnreachable:
    if isinstance(err, TimeoutError | asyncio.TimeoutError):
        return PeerUnreachable(f"peer {address} made no progress within the request timeout")
    text = clip(str(err) or type(err).__name__, 200)
    return PeerUnreachable(f"peer {address} failed: {text}")


async def _check_status(
    address: str, response: aiohttp.ClientResponse, expected: tuple[int, ...]
) -> None:
    if response.status in expected:
        return
    if response.status in (429, 503):
        text = response.headers.get("Retry-After", "")
        wait_s = parse_retry_after(text, now_s=time.time()) if text else None
        raise PeerBusy(
            f"peer {address} is busy ({response.status}); asked again in "
            f"{wait_s if wait_s is not None else PeerBusy.default_retry_after_s:.0f} s",
            retry_after_s=wait_s,
        )
    try:
        body = await _read_at_most(address, response, MAX_ERROR_BODY, is_clipped=True)
    except PeerUnreachable:
        body = b""
    raise PeerUnreachable(
        f"peer {address} answered {response.status} to {clip(response.url.path, 200)}: "
        f"{clip(body.decode(errors='replace'), 200)}"
    )


def _check_range(address: str, response: aiohttp.ClientResponse, offset: int, size: int) -> None:
    expected = f"bytes {offset}-{size - 1}/{size}"
    got = response.headers.get("Content-Range", "")
    if got != expected:
        raise PeerUnreachable(
            f"peer {address} answered range {clip(got, 80)!r} where {expected!r} was asked"
        )


async def _read_step(address: str, response: aiohttp.ClientResponse, count: int) -> bytes:
    try:
        return await response.content.readexactly(count)
    except asyncio.IncompleteReadError as err:
        raise PeerUnreachable(
            f"peer {address} ended the answer {count - len(err.partial)} bytes early"
        ) from err
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        raise _unreachable(address, err) from err


async def _read_at_most(
    address: str, response: aiohttp.ClientResponse, max_bytes: int, *, is_clipped: bool = False
) -> bytes:
    parts: list[bytes] = []
    total = 0
    try:
        while chunk := await response.content.read(min(CHUNK_BYTES, max_bytes + 1 - total)):
            parts.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                if is_clipped:
                    break
                raise PeerAnswerInvalid(f"peer {address}: answer over {max_bytes} bytes")
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        raise _unreachable(address, err) from err
    return b"".join(parts)[:max_bytes]
