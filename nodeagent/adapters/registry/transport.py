"""The registry client's HTTP transport: one GET on a fresh connection, in a worker thread.

``http.client`` in a worker thread (``asyncio.to_thread``), one connection per
request: correct HTTP/1.1 framing (chunked bodies) and TLS with hostname checks
from the standard library, where asyncio streams would need a hand-written HTTP
parser. Admission fetches two or three small documents per image, so a thread
per request costs nothing that matters. ``timeout_s`` bounds the connect and
every socket read; a cancelled caller stops waiting at once and its thread ends
within ``timeout_s``.

Every answer is bounded before it is used (docs/security.md, "Registry and credential
inputs"): at most ``MAX_HEADER_COUNT`` header fields of ``MAX_HEADER_BYTES`` in all
(``http.client`` itself refuses a line over 64 KiB and more than 100 fields); a field
given twice is joined with ``", "`` as RFC 9110 says (two ``WWW-Authenticate`` lines are
one list of challenges), except ``Content-Length``, which must be one run of at most 19
digits, given once or always the same, and no larger than the body the caller takes. A
body is read into memory up to ``MAX_MANIFEST_BYTES`` for a 200 answer (and one byte
more, so that the caller sees it was larger), ``MAX_ERROR_BODY_BYTES`` for any other;
a ``Sink`` takes a 200 body up to its own bound, hashing and counting it on the way.
An answer outside these bounds raises ``MalformedResponse`` (an ``HTTPException``, so the
client reports the registry as unavailable).
"""

from __future__ import annotations

import hashlib
import http.client
import re
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from nodeagent import __version__
from nodeagent.errors import HostFileError, RegistryUnavailable
from nodeagent.registries import MAX_MANIFEST_BYTES
from nodeagent.strict import clip, quoted

MAX_HEADER_BYTES: Final = 96 * 1024
"""All header fields of one answer together (names and values); real ones take ~2 KiB."""
MAX_HEADER_COUNT: Final = 64
"""Header fields in one answer; real ones have ~15."""
MAX_ERROR_BODY_BYTES: Final = 64 * 1024
"""The part of a non-200 answer's body that is read (nodeagent never uses it)."""
_CONTENT_LENGTH: Final = re.compile(r"[0-9]{1,19}")
MAX_URL_CHARS: Final = 8192
"""A longer realm or redirect target is refused (servers refuse longer request lines)."""
_URL_TEXT: Final = re.compile(r"[\x21-\x7e]+")

DOWNLOAD_CHUNK_BYTES: Final = 1 << 20
"""A ``Sink`` reads and writes bodies in pieces of this size."""

_USER_AGENT: Final = f"nodeagent/{__version__}"


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]
    """Lower-case names."""
    body: bytes


class MalformedResponse(http.client.HTTPException):
    """An answer outside the bounds of the module docstring; the message is clipped."""


class Writable(Protocol):
    def write(self, data: bytes, /) -> object: ...


def exchange(
    url: str,
    headers: Mapping[str, str],
    timeout_s: float,
    context: ssl.SSLContext | None,
    sink: Sink | None = None,
) -> Response:
    """GET ``url`` on a fresh connection (blocking: runs in a worker thread).

    With a ``sink``, a 200 body goes there instead of into the response.
    """
    parts = urllib.parse.urlsplit(url)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.netloc, timeout=timeout_s, context=context)
    else:
        conn = http.client.HTTPConnection(parts.netloc, timeout=timeout_s)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("GET", target, headers={"User-Agent": _USER_AGENT, **headers})
        with conn.getresponse() as response:  # closed even when its headers are refused
            return _read(response, sink)
    finally:
        conn.close()


def _read(response: http.client.HTTPResponse, sink: Sink | None) -> Response:
    lowered = checked_headers(response.getheaders())
    if sink is not None and response.status == 200:
        check_content_length(lowered, sink.max_bytes)
        sink.fill(response)
        return Response(response.status, lowered, b"")
    limit = MAX_MANIFEST_BYTES if response.status == 200 else MAX_ERROR_BODY_BYTES
    return Response(response.status, lowered, response.read(limit + 1))


def checked_headers(fields: list[tuple[str, str]]) -> dict[str, str]:
    """Header fields by lower-case name, repeated ones joined; ``MalformedResponse`` when
    there are too many or they are too large (see the module docstring)."""
    if len(fields) > MAX_HEADER_COUNT:
        raise MalformedResponse(f"the answer has {len(fields)} header fields, more than "
                                f"{MAX_HEADER_COUNT}")  # fmt: skip
    total = sum(len(name) + len(value) for name, value in fields)
    if total > MAX_HEADER_BYTES:
        raise MalformedResponse(f"the answer's header fields take {total} bytes, more than "
                                f"{MAX_HEADER_BYTES}")  # fmt: skip
    joined: dict[str, str] = {}
    for name, value in fields:
        key = name.lower()
        if key == "content-length" and joined.get(key, value) != value:
            raise MalformedResponse("the answer gives two different Content-Length values")
        joined[key] = value if key not in joined or key == "content-length" else (
            f"{joined[key]}, {value}"
        )  # fmt: skip
    return joined


def check_content_length(headers: Mapping[str, str], max_bytes: int) -> None:
    """Refuse a ``Content-Length`` that is not a number, or above ``max_bytes``."""
    value = headers.get("content-length")
    if value is None:
        return
    if not _CONTENT_LENGTH.fullmatch(value.strip()):
        raise MalformedResponse(f"Content-Length {quoted(value, 40)} is not a byte count")
    if int(value) > max_bytes:
        raise MalformedResponse(
            f"the body is {int(value)} bytes (Content-Length), more than the {max_bytes} allowed"
        )


class Sink:
    """Receives a 200 body in a worker thread: hashes, counts and writes it, up to a bound."""

    def __init__(
        self, target: Writable, max_bytes: int, on_bytes: Callable[[int], None] | None
    ) -> None:
        self.target = target
        self.max_bytes = max_bytes
        self.on_bytes = on_bytes
        self.sha256 = hashlib.sha256()
        self.size_bytes = 0
        self.stopped = threading.Event()
        """Set when the caller stopped waiting: the thread stops at the next chunk."""

    def fill(self, response: http.client.HTTPResponse) -> None:
        while self.size_bytes <= self.max_bytes and not self.stopped.is_set():
            chunk = response.read(min(DOWNLOAD_CHUNK_BYTES, self.max_bytes + 1 - self.size_bytes))
            if not chunk:
                return
            self.sha256.update(chunk)
            self.size_bytes += len(chunk)
            try:
                self.target.write(chunk)
            except OSError as err:  # not the network's fault: keep it out of RegistryUnavailable
                where = getattr(self.target, "name", "the download target")
                raise HostFileError(f"cannot write {where}: {err.strerror or err}") from err
            if self.on_bytes is not None:
                self.on_bytes(len(chunk))


# ---------------------------------------------------------------- URLs from answers
def is_http_url(url: str) -> bool:
    """Whether ``url`` is an absolute http(s) URL of bounded length without white space or
    control characters (http.client would refuse those)."""
    if len(url) > MAX_URL_CHARS or not _URL_TEXT.fullmatch(url):
        return False
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # a bad IPv6 literal, say
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def redirect_url(ref: str, url: str, location: str) -> str:
    """``location`` resolved against ``url``; ``RegistryUnavailable`` (naming ``ref``) unless
    it is an http(s) URL ``is_http_url`` accepts."""
    try:
        resolved = urllib.parse.urljoin(url, location) if len(location) <= MAX_URL_CHARS else ""
    except ValueError:
        resolved = ""
    if not is_http_url(resolved):
        raise RegistryUnavailable(
            f"{clip(ref)}: the registry redirected to {quoted(location, 120)}, which is not "
            "an http or https URL nodeagent follows"
        )
    return resolved


def realm_takes_credentials(realm: str, registry_url: str) -> bool:
    """Whether credentials may go to bearer ``realm`` for the registry at ``registry_url`` (its
    base URL, ``http://`` when registries.conf marks it insecure), docs/decisions/0055: an
    ``https`` realm on any host (Docker Hub's and GitLab's are on other hosts than their
    registries); a plain ``http`` realm only when the registry itself is plain HTTP and the
    realm is on the same host name (any port). Elsewhere the client asks for the token
    without credentials: a registry cannot have the pull secret sent in clear text to a host
    of its choosing."""
    try:
        realm_parts = urllib.parse.urlsplit(realm)
        registry_parts = urllib.parse.urlsplit(registry_url)
        realm_host, registry_host = realm_parts.hostname, registry_parts.hostname
    except ValueError:  # a bad IPv6 literal or port, say
        return False
    if realm_parts.scheme == "https":
        return True
    return (
        realm_parts.scheme == "http"
        and registry_parts.scheme == "http"
        and realm_host is not None
        and realm_host == registry_host
    )


def origin(url: str) -> tuple[str, str]:
    """Scheme and host of ``url``: credentials go only to the registry's own origin."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.netloc.lower()
