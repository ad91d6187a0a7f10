"""The fetcher's side of the peer protocol (docs/site.md): HTTPS with mutual TLS, to one peer
at a time per request.

The node presents ``[site] client_cert_file``/``client_key_file`` and checks the peer's
certificate against ``ca_file`` and the address asked (an IP SAN;
``tls.ReloadingClientTls``, re-read when the files are rotated). Every answer is bounded:
the JSON documents and the signed manifest by their format's limits, a blob by the bytes
still missing of it. Every request is bounded in time three ways (``RequestBounds``), so
a peer that sends a byte now and then never holds a caller (docs/decisions/0053):

* ``request_timeout_s``: no progress at all for that long (connecting, then each read);
* the head (connection, TLS, request, the answer's status and headers) within ``head_s``;
* a minimum rate (``Pace``): in each ``window_s`` of reading, at least
  ``min_rate_bytes_s * window_s`` bytes, or everything that was left; and a total deadline
  for the whole request, ``head_s + 2 * window_s + size / min_rate_bytes_s``, the size
  being what is asked (a blob's bytes still missing, a document's bound).

A peer cut by the last two is ``PeerTooSlow`` (a ``PeerUnreachable``). Failures are typed:
``PeerBusy`` for 429/503 with the peer's ``Retry-After`` (parsed strictly),
``PeerUnreachable`` for everything the network or the peer got wrong,
``PeerAnswerInvalid`` for documents that fail their parse. No redirect is followed and
nothing is decompressed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import aiohttp

from nodeagent.adapters.http.tls import ReloadingClientTls
from nodeagent.errors import PeerAnswerInvalid, PeerBusy, PeerTooSlow, PeerUnreachable
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
from nodeagent.units import format_bytes

CHUNK_BYTES: Final = 1 << 20
"""A blob is handed on in steps of this size (the last one shorter)."""
REPOSITORY: Final = "nodeagent/store"
"""The repository name in blob URLs (checked by the server, otherwise ignored)."""
MAX_ERROR_BODY: Final = 4 << 10

WriteChunk = Callable[[bytes], Awaitable[None]]

HEAD_S: Final = 10.0
"""Connecting, TLS, the request and the answer's head: a peer on the site's network takes
milliseconds (a busy one answers 503 at once)."""
MIN_RATE_BYTES_S: Final = 64 << 10
"""The slowest a peer may send (``[site] fetch_min_rate_bytes`` sets it): 512 kbit/s, a
tenth of what one upload of a node on a 100 Mbit/s link capped at 3 uploads gets."""
WINDOW_S: Final = 5.0
"""The rate is checked over windows of this much reading time."""


@dataclass(frozen=True, slots=True)
class RequestBounds:
    """How long one request to a peer may take (module docstring)."""

    head_s: float = HEAD_S
    min_rate_bytes_s: int = MIN_RATE_BYTES_S
    window_s: float = WINDOW_S

    def deadline_s(self, size_bytes: int) -> float:
        """The whole request's deadline, for an answer of at most ``size_bytes``."""
        return self.head_s + 2 * self.window_s + size_bytes / self.min_rate_bytes_s


@dataclass(slots=True)
class Pace:
    """The minimum rate of one answer, pure (the caller passes the loop's time): each window
    of ``window_s`` seconds spent waiting for bytes must bring ``quota`` bytes, or the rest
    of the answer. Time spent outside ``read`` (writing what came) is not counted."""

    min_rate_bytes_s: int
    window_s: float
    spent_s: float = 0.0
    """Reading time in the current window."""
    got_bytes: int = 0
    """Bytes received in the current window."""
    total_bytes: int = field(default=0)

    @property
    def quota(self) -> int:
        return max(1, int(self.min_rate_bytes_s * self.window_s))

    def time_left_s(self) -> float:
        """How long the next read may wait before the window's quota is missed."""
        return max(0.0, self.window_s - self.spent_s)

    def read(self, count: int, waited_s: float) -> None:
        """``count`` bytes came after ``waited_s`` of waiting."""
        self.spent_s += waited_s
        self.got_bytes += count
        self.total_bytes += count
        if self.got_bytes >= self.quota:  # the window is met: a new one starts
            self.spent_s, self.got_bytes = 0.0, 0

    def describe(self) -> str:
        rate = format_bytes(self.min_rate_bytes_s)
        return (
            f"{self.got_bytes} bytes in {self.window_s:g} s, under the minimum of {rate}/s "
            f"({self.total_bytes} bytes received in all)"
        )


class PeerClient:
    """Requests to peers; one connection pool, closed with ``close``."""

    def __init__(
        self,
        tls: ReloadingClientTls,
        *,
        request_timeout_s: float,
        bounds: RequestBounds | None = None,
    ) -> None:
        self._tls = tls
        self.bounds = bounds or RequestBounds()
        head_s = min(request_timeout_s, self.bounds.head_s)
        self.bounds = RequestBounds(head_s, self.bounds.min_rate_bytes_s, self.bounds.window_s)
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

    async def signature_file(
        self, address: str, bundle_id: str, name: str, max_bytes: int
    ) -> bytes | None:
        """A signature file of a bundle the peer stores; None when it answers 404 (a bundle
        carries minisign's, ECDSA's or both: decision 0075). Verified by the caller."""
        path = f"/nodeagent/v1/bundles/{bundle_id}/{name}"
        return await self._small_or_none(address, path, max_bytes, is_optional=True)

    async def _small(self, address: str, path: str, max_bytes: int) -> bytes:
        data = await self._small_or_none(address, path, max_bytes, is_optional=False)
        if data is None:  # only an optional file may be absent
            raise PeerUnreachable(f"peer {address} answered nothing to {clip(path, 200)}")
        return data

    async def _small_or_none(
        self, address: str, path: str, max_bytes: int, *, is_optional: bool
    ) -> bytes | None:
        async with (
            self._deadline(address, path, max_bytes),
            self._request(address, path, {}) as response,
        ):
            if is_optional and response.status == 404:
                return None
            await _check_status(address, response, (200,))
            if (response.content_length or 0) > max_bytes:
                raise PeerAnswerInvalid(f"peer {address}: {path} is over {max_bytes} bytes")
            return await _read_at_most(address, response, max_bytes, self._pace())

    @contextlib.asynccontextmanager
    async def _deadline(self, address: str, path: str, size_bytes: int) -> AsyncIterator[None]:
        """The total deadline of one request (``RequestBounds.deadline_s``)."""
        limit_s = self.bounds.deadline_s(size_bytes)
        try:
            async with asyncio.timeout(limit_s):
                yield
        except TimeoutError as err:
            raise PeerTooSlow(
                f"peer {address}: {clip(path, 200)} not answered whole within its deadline "
                f"of {limit_s:.0f} s"
            ) from err

    def _pace(self) -> Pace:
        return Pace(self.bounds.min_rate_bytes_s, self.bounds.window_s)

    # ------------------------------------------------------------ blobs
    async def blob(
        self, address: str, digest: str, *, offset: int, size_bytes: int, write: WriteChunk
    ) -> int:
        """Bytes ``offset`` to the end of the blob, handed to ``write`` in steps; the bytes
        received. More than the blob's size, or a range other than asked, is refused."""
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        path = f"/v2/{REPOSITORY}/blobs/{digest}"
        left = size_bytes - offset
        async with (
            self._deadline(address, path, left),
            self._request(address, path, headers) as response,
        ):
            await _check_status(address, response, (206,) if offset else (200,))
            if offset:
                _check_range(address, response, offset, size_bytes)
            if response.content_length is not None and response.content_length != left:
                raise PeerUnreachable(
                    f"peer {address} announced {response.content_length} bytes for {digest} "
                    f"where {left} were asked"
                )
            received = 0
            pace = self._pace()
            while received < left:
                chunk = await _paced(address, response, pace, min(CHUNK_BYTES, left - received))
                if not chunk:
                    raise PeerUnreachable(
                        f"peer {address} ended the answer {left - received} bytes early"
                    )
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
        head_s = self._client.bounds.head_s
        try:
            async with asyncio.timeout(head_s):
                self._response = await self._client.session().get(
                    self._client.url(self._address, self._path),
                    headers=self._headers,
                    ssl=self._client.context(),
                    allow_redirects=False,
                )
        except aiohttp.ClientError as err:  # its connect timeout among them
            raise _unreachable(self._address, err) from err
        except TimeoutError as err:  # the head's deadline (an OSError: caught before)
            raise PeerTooSlow(f"peer {self._address}: no answer head within {head_s:g} s") from err
        except (OSError, ssl.SSLError) as err:
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
        pace = Pace(MIN_RATE_BYTES_S, WINDOW_S)
        body = await _read_at_most(address, response, MAX_ERROR_BODY, pace, is_clipped=True)
    except PeerUnreachable:  # PeerTooSlow too: the status says enough
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


async def _paced(address: str, response: aiohttp.ClientResponse, pace: Pace, count: int) -> bytes:
    """Up to ``count`` bytes as they come (b"" at the answer's end), within the pace."""
    loop = asyncio.get_running_loop()
    started_s = loop.time()
    try:
        async with asyncio.timeout(pace.time_left_s()):
            chunk = await response.content.read(count)
    except aiohttp.ClientError as err:  # its no-progress timeout among them
        raise _unreachable(address, err) from err
    except TimeoutError:  # the pace's own (a TimeoutError is an OSError: caught before)
        raise PeerTooSlow(f"peer {address} sent {pace.describe()}") from None
    except OSError as err:
        raise _unreachable(address, err) from err
    pace.read(len(chunk), loop.time() - started_s)
    return chunk


async def _read_at_most(
    address: str,
    response: aiohttp.ClientResponse,
    max_bytes: int,
    pace: Pace,
    *,
    is_clipped: bool = False,
) -> bytes:
    """The answer's body, at most ``max_bytes`` (more: ``PeerAnswerInvalid``, or clipped)."""
    parts: list[bytes] = []
    total = 0
    while chunk := await _paced(address, response, pace, min(CHUNK_BYTES, max_bytes + 1 - total)):
        parts.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            if is_clipped:
                break
            raise PeerAnswerInvalid(f"peer {address}: answer over {max_bytes} bytes")
    return b"".join(parts)[:max_bytes]
