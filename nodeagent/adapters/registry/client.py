"""Read-only OCI distribution client: layer sizes of digest references, before any pull.

``RegistryClient.image_layers(ref, credentials)`` fetches ``ref``'s manifest by
digest, checks that the body hashes to that digest, follows an index to the
entry for this node's platform, and returns the compressed size of every layer
(``nodeagent.disk.ImageLayers``). It implements ``nodeagent.sync.ManifestSource``.

Transport: one GET per connection, in a worker thread
(``nodeagent.adapters.registry.transport``); TLS contexts from
``nodeagent.adapters.registry.tls``.

Scheme: HTTPS (system CAs, or ``ca_file``) unless the registry is listed in
``insecure`` (see ``nodeagent.registries.insecure_registries``): never guessed.

Auth: anonymous first. A 401 ``Basic`` challenge is answered with the
credentials (and the host remembered, so later requests send them at once); a
401 ``Bearer`` challenge with a token from its realm, fetched with the
credentials when there are any and the realm may have them
(``transport.realm_takes_credentials``: an https realm on any host, a plain-http one
only on the host of a registry that is itself plain HTTP), anonymously otherwise (logged
once, ``registry_credentials_withheld``), and cached per ``(host, scope)`` for its
lifetime. A ``registry_token`` is sent as the bearer token as it is. ``identity_token``
(OAuth2 refresh tokens) is not supported.

Challenges are read by ``registries.pick_challenge`` (linear time, at most 16 KiB),
token answers by ``registries.parse_token_answer`` (strict JSON, bounded token and
lifetime); a malformed challenge, a bearer realm that is not an http(s) URL of at most
``MAX_URL_CHARS`` visible characters, or a broken token answer is ``RegistryError`` (the
registry is up but its answer is broken: retried soon). A redirect target must be such
a URL too (else ``RegistryUnavailable``).

Errors name the reference, never a credential: 401/403 after auth →
``RegistryAuthFailed``; 404 → ``ImageNotFound``; connection failures, 429 and
5xx → ``RegistryUnavailable`` (``Retry-After`` honoured, at most an hour); every one raised
``from`` its cause.

Unreachable hosts are remembered: a host that could not be reached (refused, timed out,
TLS failure) is not asked again for ``unreachable_memory_s`` (default 300 s, about one
sync); every look-up meant for it fails at once with the first failure's reason instead of
waiting out another timeout, so a sync of many images behind a dead source registry or
mirror costs one timeout, not one per image. A mirror so remembered is skipped.

Manifests by digest never change: ``ManifestCache``
(``nodeagent.adapters.registry.cache``) keeps what admission needs forever, in
memory and, given a directory, on disk.

``fetch_to(ref, digest, target, ...)`` streams one blob or manifest of ``ref``'s
repository into a writable ``target`` (``bundle create`` uses it), hashing it on
the way and refusing content that exceeds its size bound or misses its digest.
It follows redirects (registries serve blobs from object storage), sending
credentials only to the registry's own host.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Final, TypeVar

import structlog

from nodeagent.adapters.registry.cache import ManifestCache
from nodeagent.adapters.registry.mirrors import Route, pull_sources
from nodeagent.adapters.registry.targets import Fetched, Target, Token, raise_for_status
from nodeagent.adapters.registry.tls import SYSTEM_CA_DIRS, HostContexts
from nodeagent.adapters.registry.transport import (
    MalformedResponse,
    Response,
    Sink,
    Writable,
    exchange,
    is_http_url,
    origin,
    realm_takes_credentials,
    redirect_url,
)
from nodeagent.adapters.registry.unreachable import UnreachableHosts
from nodeagent.disk import ImageLayers
from nodeagent.errors import (
    ImageNotFound,
    RegistryAuthFailed,
    RegistryCertsInvalid,
    RegistryError,
    RegistryUnavailable,
)
from nodeagent.ports import RegistryCredentials
from nodeagent.registries import (
    DOCKER_HUB,
    MANIFEST_ACCEPT,
    MAX_MANIFEST_BYTES,
    Challenge,
    ImageManifest,
    ManifestIndex,
    Platform,
    basic_authorization,
    is_insecure,
    is_sha256_digest,
    node_platform,
    parse_docker_digest_reference,
    parse_manifest,
    parse_token_answer,
    pick_challenge,
    select_platform,
    verify_digest,
)
from nodeagent.strict import clip, quoted

log = structlog.get_logger(__name__)

MAX_REDIRECTS: Final = 5
_REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
_DOCKER_HUB_API: Final = "registry-1.docker.io"
MIRROR_FAULTS: Final = (
    RegistryUnavailable,
    ImageNotFound,
    RegistryAuthFailed,
    RegistryCertsInvalid,
)
"""Failures of one mirror after which the next source is asked, as CRI-O does."""
_T = TypeVar("_T")


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
    ``routes``: registries.conf's mirrors (``mirrors.routes_of``), asked before each look-up.
    ``credentials_for``: credentials for a mirror's reference (the image's own are passed in).
    ``unreachable_memory_s``: how long a host that could not be reached is not asked again.
    ``certs_dirs``: containers-certs.d(5) directories (``tls.CERTS_DIRS`` on a node): a host's
    ``*.crt`` there are trusted besides the CAs above.
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
        routes: Callable[[], Sequence[Route]] = tuple,
        credentials_for: Callable[[str], RegistryCredentials | None] = lambda _ref: None,
        unreachable_memory_s: float = 300.0,
        certs_dirs: Sequence[Path] = (),
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
        self._tls = HostContexts(ca_file, ca_dirs, certs_dirs)
        self._tokens: dict[tuple[str, str], Token] = {}
        self._routes = routes
        self._credentials_for = credentials_for
        self._basic_hosts: set[str] = set()
        self._withheld: set[tuple[str, tuple[str, str]]] = set()
        self.unreachable = UnreachableHosts(unreachable_memory_s, clock)

    async def image_layers(
        self, ref: str, credentials: RegistryCredentials | None = None
    ) -> ImageLayers:
        """Config and layer sizes of ``ref`` (``host[:port]/repo@sha256:…``) for this platform.

        Read where CRI-O would pull it from: registries.conf's mirrors for it first, then its
        own registry (``mirrors.pull_sources``); the manifest cache before any of them. When
        every source fails, the last one's error (the image's own registry) is raised.
        """

        async def layers(target: Target) -> ImageLayers:
            digest, manifest = await self._image_manifest(target, target.digest)
            return ImageLayers(ref, digest, manifest.config_size_bytes, manifest.layers)

        return await self._from_sources(ref, credentials, layers)

    async def _from_sources(
        self,
        ref: str,
        credentials: RegistryCredentials | None,
        attempt: Callable[[Target], Awaitable[_T]],
        can_fall_back: Callable[[], bool] = lambda: True,
    ) -> _T:
        """``attempt`` on each source of ``ref`` in CRI-O's order (``mirrors.pull_sources``):
        registries.conf's mirrors with their hosts' credentials (``credentials_for``), then
        the image's own registry with ``credentials`` (when None, its host's from
        ``credentials_for``). A mirror that fails is logged and the
        next one asked, unless ``can_fall_back()`` says the attempt already wrote bytes; when
        every source fails, the last one's error (the image's own registry) is raised."""
        *mirrors, own = pull_sources(ref, self._routes())
        for source in mirrors:
            try:
                return await attempt(self._target(source, self._credentials_for(source)))
            except MIRROR_FAULTS as exc:
                if not can_fall_back():
                    raise
                log.info("mirror_unusable", image=ref, mirror=source, reason=exc.reason)
        own_credentials = credentials if credentials is not None and own == ref else None
        own_credentials = own_credentials or self._credentials_for(own)
        return await attempt(self._target(own, own_credentials))

    def _target(self, ref: str, credentials: RegistryCredentials | None) -> Target:
        parsed = parse_docker_digest_reference(ref)
        host = _DOCKER_HUB_API if parsed.registry == DOCKER_HUB else parsed.registry
        is_plain = is_insecure(parsed.registry, parsed.repository, self._insecure())
        base_url = f"{'http' if is_plain else 'https'}://{host}"
        digest = parsed.digest or ""  # never empty: parse_docker_digest_reference checked it
        return Target(ref, host, parsed.repository, digest, base_url, credentials)

    async def _image_manifest(
        self, target: Target, digest: str, *, is_child: bool = False
    ) -> tuple[str, ImageManifest]:
        found = await asyncio.to_thread(self.cache.get, digest, self.platform)
        if found is None:
            found = await self._fetch_manifest(target, digest)
        if isinstance(found, ImageManifest):
            return digest, found
        if is_child or not is_sha256_digest(found):
            raise ImageNotFound(f"{target.ref}: its index entry {found!r} is not an image manifest")
        return await self._image_manifest(target, found, is_child=True)

    async def _fetch_manifest(self, target: Target, digest: str) -> ImageManifest | str:
        """GET and verify one manifest; remember it; an index yields the child digest."""
        url = f"{target.base_url}/v2/{target.repository}/manifests/{digest}"
        response = await self._get_authorized(target, url)
        raise_for_status(response, target.ref, f"manifest {digest}")
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
        callers write to a temporary file and keep it only when this returns. Read from
        registries.conf's mirrors first, as ``image_layers``; a mirror that fails before
        any of the body reached ``target`` leaves it to the next source.
        """
        kind = "manifest" if is_manifest else "blob"
        sinks: list[Sink] = []

        async def fetch(where: Target) -> Fetched:
            url = f"{where.base_url}/v2/{where.repository}/{kind}s/{digest}"
            sinks.append(sink := Sink(target, max_bytes, on_bytes))
            response = await self._get_authorized(where, url, sink)
            response = await self._follow_redirects(where, url, response, sink)
            raise_for_status(response, where.ref, f"{kind} {digest}")
            actual = "sha256:" + sink.sha256.hexdigest()
            if sink.size_bytes > max_bytes or actual != digest:
                raise RegistryUnavailable(
                    f"{where.ref}: the registry served a {kind} that is not {digest} (more "
                    f"than {max_bytes} B or another sha256); refusing it (a broken proxy or cache?)"
                )
            return Fetched(digest, sink.size_bytes, response.headers.get("content-type", ""))

        return await self._from_sources(
            ref, credentials, fetch, lambda: not sinks or sinks[-1].size_bytes == 0
        )

    async def fetch_tag_to(
        self,
        ref: str,
        tag: str,
        target: Writable,
        credentials: RegistryCredentials | None = None,
        *,
        max_bytes: int,
    ) -> Fetched | None:
        """Write the manifest tagged ``tag`` in ``ref``'s repository into ``target``; None when
        the registry has no such tag. Its digest is what was received (a tag names no digest):
        ``bundle create`` looks up sigstore tags (``sha256-<hex>.sig``) so. Asked of the same
        sources as ``fetch_to``: the first that answers (with the tag or a 404) decides."""

        async def fetch(where: Target) -> Fetched | None:
            url = f"{where.base_url}/v2/{where.repository}/manifests/{urllib.parse.quote(tag)}"
            sink = Sink(target, max_bytes, None)
            response = await self._get_authorized(where, url, sink)
            if response.status == 404:
                return None
            raise_for_status(response, where.ref, f"manifest {tag}")
            if sink.size_bytes > max_bytes:
                raise RegistryUnavailable(f"{where.ref}: manifest {tag} is more than {max_bytes} B")
            digest = "sha256:" + sink.sha256.hexdigest()
            return Fetched(digest, sink.size_bytes, response.headers.get("content-type", ""))

        return await self._from_sources(ref, credentials, fetch)

    async def _follow_redirects(
        self, target: Target, url: str, response: Response, sink: Sink
    ) -> Response:
        """Follow ``Location`` answers; credentials go only to the registry's own host."""
        for _ in range(MAX_REDIRECTS):
            location = response.headers.get("location")
            if response.status not in _REDIRECT_STATUSES or not location:
                return response
            url = redirect_url(target.ref, url, location)
            is_own = origin(url) == origin(target.base_url)  # never credentials over plain HTTP
            headers = self._known_auth(target) if is_own else {}
            response = await self._get(target, url, headers, sink)
        if response.status in _REDIRECT_STATUSES:
            raise RegistryUnavailable(f"{target.ref}: more than {MAX_REDIRECTS} redirects")
        return response

    # ---------------------------------------------------------------- auth

    async def _get_authorized(self, target: Target, url: str, sink: Sink | None = None) -> Response:
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

    def _known_auth(self, target: Target) -> dict[str, str]:
        """Authorization we can send up front: a live cached token, or basic for a known host."""
        token = self._tokens.get((target.host, target.scope))
        if token is not None and token.expires_at_s > self._clock():
            return {"Authorization": f"Bearer {token.value}"}
        basic = basic_authorization(target.credentials) if target.credentials else None
        if basic is not None and target.host in self._basic_hosts:
            return {"Authorization": basic}
        return {}

    async def _answer(self, target: Target, response: Response) -> str:
        """The ``Authorization`` value answering a 401 challenge."""
        header = response.headers.get("www-authenticate", "")
        challenge = pick_challenge(header, ref=target.ref, host=target.host)
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
            f"{clip(target.ref)}: registry {target.host} asks for unsupported authentication "
            f"{quoted(challenge.scheme or '(none given)', 60)}"
        )

    async def _token(self, target: Target, challenge: Challenge) -> str:
        if target.credentials is not None and target.credentials.registry_token:
            return target.credentials.registry_token
        realm = challenge.params.get("realm", "")
        if not is_http_url(realm):  # a broken answer, not a refusal: retried like a 5xx
            raise RegistryError(
                f"{clip(target.ref)}: registry {target.host} sent a bearer challenge without a "
                f"usable realm (an http or https URL): {quoted(realm, 120)}; retrying later"
            )
        scope = challenge.params.get("scope") or target.scope
        cached = self._tokens.get((target.host, scope))
        if cached is not None and cached.expires_at_s > self._clock():
            return cached.value
        token = await self._fetch_token(target, realm, challenge.params.get("service"), scope)
        self._tokens[(target.host, scope)] = token
        return token.value

    async def _fetch_token(
        self, target: Target, realm: str, service: str | None, scope: str
    ) -> Token:
        params = {"service": service, "scope": scope} if service else {"scope": scope}
        query = urllib.parse.urlencode(params)
        url = f"{realm}{'&' if '?' in realm else '?'}{query}"
        basic = basic_authorization(target.credentials) if target.credentials else None
        if basic is not None and not realm_takes_credentials(realm, target.base_url):
            self._withhold(target, realm)
            basic = None
        response = await self._get(target, url, {"Authorization": basic} if basic else {})
        raise_for_status(response, target.ref, "pull token")
        return self._parse_token(target.ref, response.body)

    def _withhold(self, target: Target, realm: str) -> None:
        """Log once per registry and realm that its credentials were not sent to the realm."""
        where = (target.host, origin(realm))
        if where in self._withheld:
            return
        self._withheld.add(where)
        log.warning(
            "registry_credentials_withheld",
            image=clip(target.ref, 200),
            registry=target.host,
            realm=clip(realm.partition("?")[0], 200),
            reason=RegistryAuthFailed.reason,
        )

    def _parse_token(self, ref: str, body: bytes) -> Token:
        answer = parse_token_answer(body, ref=ref)
        # Renew a little early so that a token never expires between check and use.
        return Token(answer.token, self._clock() + answer.lifetime_s * 0.9)

    async def _get(
        self, target: Target, url: str, headers: Mapping[str, str], sink: Sink | None = None
    ) -> Response:
        parts = urllib.parse.urlsplit(url)
        where = clip(parts.netloc, 120)
        # By scheme too: an edit of registries.conf that makes a host insecure asks it again.
        self.unreachable.check(target.ref, where, parts.scheme)
        try:
            context = self._tls.for_host(parts.netloc) if parts.scheme == "https" else None
            return await asyncio.to_thread(exchange, url, headers, self.timeout_s, context, sink)
        except MalformedResponse as err:
            raise RegistryUnavailable(
                f"{clip(target.ref)}: {where} answered outside nodeagent's bounds: {err}"
            ) from err
        except (OSError, http.client.HTTPException, ValueError) as err:
            # ValueError: http.client refuses a URL or header value (control characters)
            reason = clip(str(err) or type(err).__name__, 200)
            if not isinstance(err, ValueError):  # the host, not this request, is at fault
                self.unreachable.note(where, parts.scheme, reason)
            raise RegistryUnavailable(
                f"{clip(target.ref)}: cannot reach {where}: {reason}"
            ) from err
        except asyncio.CancelledError:
            if sink is not None:  # the worker thread stops writing at its next chunk
                sink.stopped.set()
            raise
