"""Read-only OCI distribution client: layer sizes of digest references, before any pull.

``RegistryClient.image_layers(ref, credentials)`` fetches ``ref``'s manifest by
digest, checks that the body hashes to that digest, follows an index to the
entry for this node's platform, and returns the compressed size of every layer
(``nodeagent.disk.ImageLayers``). It implements ``nodeagent.sync.ManifestSource``.

Transport: ``http.client`` in a worker thread (``asyncio.to_thread``), one
connection per request: correct HTTP/1.1 framing (chunked bodies) and TLS with
hostname checks from the standard library, where asyncio streams would need a
hand-written HTTP parser. Admission fetches two or three small documents per
image, so a thread per request costs nothing that matters. ``timeout_s`` bounds
the connect and every socket read; a cancelled caller stops waiting at once and
its thread ends within ``timeout_s``.

Scheme: HTTPS (system CAs, or ``ca_file``) unless the registry is listed in
``insecure`` (see ``nodeagent.registries.insecure_registries``): never guessed.

Auth: anonymous first. A 401 ``Basic`` challenge is answered with the
credentials (and the host remembered, so later requests send them at once); a
401 ``Bearer`` challenge with a token from its realm, fetched with the
credentials when there are any (anonymously otherwise) and cached per
``(host, scope)`` for its lifetime. A ``registry_token`` is sent as the bearer
token as it is. ``identity_token`` (OAuth2 refresh tokens) is not supported.

Errors name the reference, never a credential: 401/403 after auth →
``RegistryAuthFailed``; 404 → ``ImageNotFound``; connection failures, 429 and
5xx → ``RegistryUnavailable`` (``Retry-After`` honoured); every one raised
``from`` its cause.

Manifests by digest never change, so ``ManifestCache`` keeps what admission
needs (sizes, and which index entry this platform takes) forever: in memory
and, given a directory, as one small JSON file per digest.

``fetch_to(ref, digest, target, ...)`` streams one blob or manifest of ``ref``'s
repository into a writable ``target`` (``bundle create`` uses it), hashing it on
the way and refusing content that exceeds its size bound or misses its digest.
It follows redirects (registries serve blobs from object storage), sending
credentials only to the registry's own host.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import re
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import structlog

from nodeagent import __version__
from nodeagent.adapters.files import write_atomic
from nodeagent.disk import ImageLayers
from nodeagent.errors import HostFileError, ImageNotFound, RegistryAuthFailed, RegistryUnavailable
from nodeagent.ports import RegistryCredentials
from nodeagent.registries import (
    DOCKER_HUB,
    MANIFEST_ACCEPT,
    Challenge,
    ImageManifest,
    ManifestIndex,
    Platform,
    basic_authorization,
    is_insecure,
    is_sha256_digest,
    node_platform,
    parse_challenge,
    parse_digest_reference,
    parse_manifest,
    select_platform,
    status_error,
    verify_digest,
)

log = structlog.get_logger(__name__)

MAX_MANIFEST_BYTES: Final = 4 * 1024 * 1024
"""Larger manifest bodies are refused (containers-image uses the same limit)."""

DEFAULT_TOKEN_LIFETIME_S: Final = 60.0
"""A token response without ``expires_in`` is valid this long (distribution's token spec)."""

DOWNLOAD_CHUNK_BYTES: Final = 1 << 20
"""``fetch_to`` reads and writes bodies in pieces of this size."""

MAX_REDIRECTS: Final = 5
_REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
_DOCKER_HUB_API: Final = "registry-1.docker.io"
_USER_AGENT: Final = f"nodeagent/{__version__}"


@dataclass(frozen=True, slots=True)
class _Response:
    status: int
    headers: Mapping[str, str]
    """Lower-case names."""
    body: bytes


@dataclass(frozen=True, slots=True)
class _Target:
    """One image's repository and how to talk to its registry."""

    ref: str
    host: str
    repository: str
    digest: str
    base_url: str
    credentials: RegistryCredentials | None

    @property
    def scope(self) -> str:
        return f"repository:{self.repository}:pull"


@dataclass(frozen=True, slots=True)
class Fetched:
    """What ``fetch_to`` wrote: verified content ``digest`` of ``size_bytes``."""

    digest: str
    size_bytes: int
    media_type: str
    """The ``Content-Type`` the registry sent (a manifest's media type); may be empty."""


class Writable(Protocol):
    def write(self, data: bytes, /) -> object: ...


class _Sink:
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


# ------------------------------------------------------------------------- HTTP


def _exchange(
    url: str,
    headers: Mapping[str, str],
    timeout_s: float,
    context: ssl.SSLContext | None,
    sink: _Sink | None = None,
) -> _Response:
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
        response = conn.getresponse()
        lowered = {name.lower(): value for name, value in response.getheaders()}
        if sink is not None and response.status == 200:
            sink.fill(response)
            return _Response(response.status, lowered, b"")
        body = response.read(MAX_MANIFEST_BYTES + 1)
        return _Response(response.status, lowered, body)
    finally:
        conn.close()


def _raise_for_status(response: _Response, ref: str, what: str) -> None:
    error = status_error(response.status, response.headers, ref=ref, what=what)
    if error is not None:
        raise error


# ------------------------------------------------------------------------- cache


class ManifestCache:
    """Manifest facts by digest, kept forever: they cannot change.

    Entries are ``ImageManifest`` (config and layer sizes) per image-manifest
    digest, and the chosen child digest per ``(index digest, platform)``. With
    ``directory``, each entry is also one JSON file there, written atomically,
    and read back by later processes; an unreadable file counts as a miss.
    Methods block on file I/O when a directory is set: call them from a thread.
    """

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self._entries: dict[str, ImageManifest | str] = {}

    def get(self, digest: str, platform: Platform) -> ImageManifest | str | None:
        """The image manifest for ``digest``, the child to follow for an index, or None."""
        for key in (_image_key(digest), _child_key(digest, platform)):
            found = self._entries.get(key)
            if found is None:
                found = self._load(key)
            if found is not None:
                self._entries[key] = found
                return found
        return None

    def put_image(self, digest: str, manifest: ImageManifest) -> None:
        key = _image_key(digest)
        self._entries[key] = manifest
        doc = {"config_size_bytes": manifest.config_size_bytes, "layers": manifest.layers}
        self._store(key, doc)

    def put_child(self, digest: str, platform: Platform, child_digest: str) -> None:
        key = _child_key(digest, platform)
        self._entries[key] = child_digest
        self._store(key, {"child": child_digest})

    def _load(self, key: str) -> ImageManifest | str | None:
        if self.directory is None:
            return None
        try:
            doc = json.loads((self.directory / f"{key}.json").read_bytes())
            return _entry_from_json(doc)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as err:
            log.warning("manifest_cache_entry_ignored", entry=key, error=str(err))
            return None

    def _store(self, key: str, doc: Mapping[str, Any]) -> None:
        if self.directory is None:
            return
        data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        try:
            write_atomic(self.directory / f"{key}.json", data, mode=0o644)
        except HostFileError as err:
            log.warning("manifest_cache_write_failed", entry=key, error=err.message)


def _image_key(digest: str) -> str:
    return digest.replace(":", "-")


def _child_key(digest: str, platform: Platform) -> str:
    return f"{_image_key(digest)}.{str(platform).replace('/', '-')}"


def _entry_from_json(doc: Any) -> ImageManifest | str:
    if "child" in doc:
        child = doc["child"]
        if not isinstance(child, str) or not is_sha256_digest(child):
            raise ValueError(f"bad child digest {child!r}")
        return child
    layers = tuple((str(digest), int(size)) for digest, size in doc["layers"])
    return ImageManifest(int(doc["config_size_bytes"]), layers)


# ------------------------------------------------------------------------- client


@dataclass(slots=True)
class _Token:
    value: str
    expires_at_s: float


SYSTEM_CA_DIRS: Final = (
    Path("/etc/pki/ca-trust/extracted/pem/directory-hash"),  # RHEL 9+, Fedora
    Path("/etc/ssl/certs"),  # Debian, Ubuntu, SUSE
)
_HASHED_NAME: Final = re.compile(r"[0-9a-f]{8}\.[0-9]+")


def tls_context(ca_file: Path | None, ca_dirs: Sequence[Path] = SYSTEM_CA_DIRS) -> ssl.SSLContext:
    """The verifying TLS context for registries.

    ``ca_file`` alone when given. Otherwise the system's CAs from the first hashed directory
    of ``ca_dirs`` (OpenSSL opens a CA there only when a chain names it): loading the whole
    bundle up front keeps ~140 parsed certificates, 1.2 MiB, in a daemon that may only ever
    talk to one registry. Without such a directory, or when ``SSL_CERT_FILE`` or
    ``SSL_CERT_DIR`` say otherwise, OpenSSL's defaults as usual.
    """
    if ca_file is not None:
        return ssl.create_default_context(cafile=str(ca_file))
    if not {"SSL_CERT_FILE", "SSL_CERT_DIR"} & os.environ.keys():
        for directory in ca_dirs:
            if _is_hashed_dir(directory):
                return ssl.create_default_context(capath=str(directory))
    return ssl.create_default_context()


def _is_hashed_dir(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(_HASHED_NAME.fullmatch(entry.name) for entry in entries)
    except OSError:
        return False


class RegistryClient:
    """Fetches ``ImageLayers`` for digest references; see the module docstring.

    ``insecure``: registry locations to reach over plain HTTP (default none), or a callable
    asked before each look-up (the daemon's re-reads registries.conf when it changes).
    ``timeout_s``: connect and per-read socket timeout (default 30 s).
    ``ca_file``: PEM bundle trusted instead of the system CAs (default: system CAs).
    ``ca_dirs``: where to look for the system CAs as a hashed directory (see ``tls_context``).
    ``cache``: shared ``ManifestCache`` (default: a private in-memory one).
    ``platform``: the index entry to follow (default: Linux on this machine's CPU).
    ``clock``: monotonic seconds, for token lifetimes (tests pass a virtual clock).
    """

    def __init__(
        self,
        *,
        insecure: Collection[str] | Callable[[], Collection[str]] = frozenset(),
        timeout_s: float = 30.0,
        ca_file: Path | None = None,
        ca_dirs: Sequence[Path] = SYSTEM_CA_DIRS,
        cache: ManifestCache | None = None,
        platform: Platform | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if callable(insecure):
            self._insecure = insecure
        else:
            fixed = frozenset(insecure)
            self._insecure = lambda: fixed
        self.timeout_s = timeout_s
        self.cache = cache if cache is not None else ManifestCache()
        self.platform = platform or node_platform(os.uname().machine)
        self._clock = clock
        self._ca_file = ca_file
        self._ca_dirs = ca_dirs
        self._ssl: ssl.SSLContext | None = None
        """Made for the first HTTPS request: loading the CAs costs 1-2 MiB that HTTP never needs."""
        self._tokens: dict[tuple[str, str], _Token] = {}
        self._basic_hosts: set[str] = set()

    async def image_layers(
        self, ref: str, credentials: RegistryCredentials | None = None
    ) -> ImageLayers:
        """Config and layer sizes of ``ref`` (``host[:port]/repo@sha256:…``) for this platform."""
        target = self._target(ref, credentials)
        manifest_digest, manifest = await self._image_manifest(target, target.digest)
        return ImageLayers(ref, manifest_digest, manifest.config_size_bytes, manifest.layers)

    def _target(self, ref: str, credentials: RegistryCredentials | None) -> _Target:
        parsed = parse_digest_reference(ref)
        host = _DOCKER_HUB_API if parsed.registry == DOCKER_HUB else parsed.registry
        is_plain = is_insecure(parsed.registry, parsed.repository, self._insecure())
        base_url = f"{'http' if is_plain else 'https'}://{host}"
        digest = parsed.digest or ""  # never empty: parse_digest_reference checked it
        return _Target(ref, host, parsed.repository, digest, base_url, credentials)

    async def _image_manifest(
        self, target: _Target, digest: str, *, is_child: bool = False
    ) -> tuple[str, ImageManifest]:
        found = await asyncio.to_thread(self.cache.get, digest, self.platform)
        if found is None:
            found = await self._fetch_manifest(target, digest)
        if isinstance(found, ImageManifest):
            return digest, found
        if is_child or not is_sha256_digest(found):
            raise ImageNotFound(f"{target.ref}: its index entry {found!r} is not an image manifest")
        return await self._image_manifest(target, found, is_child=True)

    async def _fetch_manifest(self, target: _Target, digest: str) -> ImageManifest | str:
        """GET and verify one manifest; remember it; an index yields the child digest."""
        url = f"{target.base_url}/v2/{target.repository}/manifests/{digest}"
        response = await self._get_authorized(target, url)
        _raise_for_status(response, target.ref, f"manifest {digest}")
        if len(response.body) > MAX_MANIFEST_BYTES:
            raise ImageNotFound(f"{target.ref}: manifest {digest} exceeds {MAX_MANIFEST_BYTES} B")
        if not verify_digest(response.body, digest):
            raise RegistryUnavailable(
                f"{target.ref}: the registry served a manifest whose sha256 is not {digest}; "
                "refusing it (a broken proxy or cache in between?)"
            )
        content_type = response.headers.get("content-type", "")
        parsed = parse_manifest(response.body, content_type, ref=target.ref)
        if isinstance(parsed, ManifestIndex):
            child = select_platform(parsed, self.platform, ref=target.ref)
            await asyncio.to_thread(self.cache.put_child, digest, self.platform, child)
            return child
        await asyncio.to_thread(self.cache.put_image, digest, parsed)
        return parsed

    async def fetch_to(
        self,
        ref: str,
        digest: str,
        target: Writable,
        credentials: RegistryCredentials | None = None,
        *,
        max_bytes: int,
        is_manifest: bool = False,
        on_bytes: Callable[[int], None] | None = None,
    ) -> Fetched:
        """Write blob (or manifest) ``digest`` of ``ref``'s repository into ``target``, verified.

        The body streams through sha256 into ``target`` in a worker thread, where
        ``on_bytes(n)`` is called after each chunk. More than ``max_bytes``, or content
        that is not ``digest``, raises ``RegistryUnavailable`` after ``target`` got bytes:
        callers write to a temporary file and keep it only when this returns.
        """
        where = self._target(ref, credentials)
        kind = "manifest" if is_manifest else "blob"
        url = f"{where.base_url}/v2/{where.repository}/{kind}s/{digest}"
        sink = _Sink(target, max_bytes, on_bytes)
        response = await self._get_authorized(where, url, sink)
        response = await self._follow_redirects(where, url, response, sink)
        _raise_for_status(response, ref, f"{kind} {digest}")
        actual = "sha256:" + sink.sha256.hexdigest()
        if sink.size_bytes > max_bytes or actual != digest:
            raise RegistryUnavailable(
                f"{ref}: the registry served a {kind} that is not {digest} (more than "
                f"{max_bytes} B or another sha256); refusing it (a broken proxy or cache?)"
            )
        return Fetched(digest, sink.size_bytes, response.headers.get("content-type", ""))

    async def _follow_redirects(
        self, target: _Target, url: str, response: _Response, sink: _Sink
    ) -> _Response:
        """Follow ``Location`` answers; credentials go only to the registry's own host."""
        for _ in range(MAX_REDIRECTS):
            location = response.headers.get("location")
            if response.status not in _REDIRECT_STATUSES or not location:
                return response
            url = urllib.parse.urljoin(url, location)
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https"):
                raise RegistryUnavailable(f"{target.ref}: redirected to unsupported {url!r}")
            is_own = parts.netloc == urllib.parse.urlsplit(target.base_url).netloc
            headers = self._known_auth(target) if is_own else {}
            response = await self._get(target, url, headers, sink)
        if response.status in _REDIRECT_STATUSES:
            raise RegistryUnavailable(f"{target.ref}: more than {MAX_REDIRECTS} redirects")
        return response

    # ---------------------------------------------------------------- auth

    async def _get_authorized(
        self, target: _Target, url: str, sink: _Sink | None = None
    ) -> _Response:
        headers = {"Accept": MANIFEST_ACCEPT}
        sent = self._known_auth(target)
        response = await self._get(target, url, {**headers, **sent}, sink)
        if response.status != 401:
            return response
        if sent:  # what we remembered is no longer accepted (token revoked, password changed)
            self._tokens.pop((target.host, target.scope), None)
            self._basic_hosts.discard(target.host)
        authorization = await self._answer(target, response)
        return await self._get(target, url, {**headers, "Authorization": authorization}, sink)

    def _known_auth(self, target: _Target) -> dict[str, str]:
        """Authorization we can send up front: a live cached token, or basic for a known host."""
        token = self._tokens.get((target.host, target.scope))
        if token is not None and token.expires_at_s > self._clock():
            return {"Authorization": f"Bearer {token.value}"}
        basic = basic_authorization(target.credentials) if target.credentials else None
        if basic is not None and target.host in self._basic_hosts:
            return {"Authorization": basic}
        return {}

    async def _answer(self, target: _Target, response: _Response) -> str:
        """The ``Authorization`` value answering a 401 challenge."""
        challenge = parse_challenge(response.headers.get("www-authenticate", ""))
        if challenge.scheme == "basic":
            basic = basic_authorization(target.credentials) if target.credentials else None
            if basic is None:
                raise RegistryAuthFailed(
                    f"{target.ref}: registry {target.host} requires credentials and the "
                    "pull secret has none for it"
                )
            self._basic_hosts.add(target.host)
            return basic
        if challenge.scheme == "bearer":
            return f"Bearer {await self._token(target, challenge)}"
        raise RegistryAuthFailed(
            f"{target.ref}: registry {target.host} asks for unsupported authentication "
            f"{challenge.scheme or '(none given)'!r}"
        )

    async def _token(self, target: _Target, challenge: Challenge) -> str:
        if target.credentials is not None and target.credentials.registry_token:
            return target.credentials.registry_token
        realm = challenge.params.get("realm", "")
        if urllib.parse.urlsplit(realm).scheme not in ("http", "https"):
            raise RegistryAuthFailed(f"{target.ref}: bearer challenge without a usable realm")
        scope = challenge.params.get("scope") or target.scope
        cached = self._tokens.get((target.host, scope))
        if cached is not None and cached.expires_at_s > self._clock():
            return cached.value
        token = await self._fetch_token(target, realm, challenge.params.get("service"), scope)
        self._tokens[(target.host, scope)] = token
        return token.value

    async def _fetch_token(
        self, target: _Target, realm: str, service: str | None, scope: str
    ) -> _Token:
        params = {"service": service, "scope": scope} if service else {"scope": scope}
        query = urllib.parse.urlencode(params)
        url = f"{realm}{'&' if '?' in realm else '?'}{query}"
        basic = basic_authorization(target.credentials) if target.credentials else None
        response = await self._get(target, url, {"Authorization": basic} if basic else {})
        _raise_for_status(response, target.ref, "pull token")
        return self._parse_token(target.ref, response.body)

    def _parse_token(self, ref: str, body: bytes) -> _Token:
        try:
            doc = json.loads(body)
            value = doc.get("token") or doc.get("access_token")
            lifetime_s = float(doc.get("expires_in") or DEFAULT_TOKEN_LIFETIME_S)
        except (ValueError, AttributeError, TypeError) as err:
            raise RegistryUnavailable(f"{ref}: the token server's answer is not JSON") from err
        if not isinstance(value, str) or not value:
            raise RegistryUnavailable(f"{ref}: the token server's answer holds no token")
        # Renew a little early so that a token never expires between check and use.
        return _Token(value, self._clock() + lifetime_s * 0.9)

    def _tls_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = tls_context(self._ca_file, self._ca_dirs)
        return self._ssl

    async def _get(
        self, target: _Target, url: str, headers: Mapping[str, str], sink: _Sink | None = None
    ) -> _Response:
        try:
            context = self._tls_context() if url.startswith("https:") else None
            return await asyncio.to_thread(_exchange, url, headers, self.timeout_s, context, sink)
        except (OSError, http.client.HTTPException) as err:
            where = urllib.parse.urlsplit(url).netloc
            reason = str(err) or type(err).__name__
            raise RegistryUnavailable(f"{target.ref}: cannot reach {where}: {reason}") from err
        except asyncio.CancelledError:
            if sink is not None:  # the worker thread stops writing at its next chunk
                sink.stopped.set()
            raise
