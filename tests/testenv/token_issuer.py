"""A tiny bearer-token issuer for a docker-registry started with `auth: token`.

distribution's token auth sends clients to `realm` with `service` and `scope`;
the issuer checks HTTP basic credentials and answers `{"token": JWT, "expires_in": N}`.
The registry verifies the JWT's RS256 signature with a key it trusts by ID: the
libtrust fingerprint of the public key in `rootcertbundle` (the `kid` header), so
the issuer needs no certificate chain in the token. Keys and certificates come
from the `openssl` CLI, which also signs (no Python crypto package needed).

Anonymous requests get a token that grants nothing (Docker Hub style), so the
registry refuses it with 401; wrong credentials get 401 from the issuer itself.
Every request is recorded in `requests` for assertions.

    with TokenIssuer(tmp_path, users={"bob": "pw"}) as issuer:
        with Registry(tmp_path / "reg", token_auth=issuer.config()) as registry: ...
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import ssl
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.testenv.lifecycle import Service
from tests.testenv.registry import TokenAuthConfig, make_certificate

SERVICE = "nodeagent-testenv-registry"
ISSUER = "nodeagent-testenv-issuer"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def libtrust_key_id(public_key_der: bytes) -> str:
    """distribution's key ID: base32 of SHA-256(DER SPKI)[:30], in 12 groups of 4 joined by ':'."""
    encoded = base64.b32encode(hashlib.sha256(public_key_der).digest()[:30]).decode().rstrip("=")
    return ":".join(encoded[i : i + 4] for i in range(0, len(encoded), 4))


@dataclass(frozen=True)
class TokenRequest:
    """One request the issuer answered: who asked (None: anonymous), for what, with what status."""

    user: str | None
    scope: str
    service: str
    status: int
    authorization: str | None = None
    """The ``Authorization`` header as received (None: there was none)."""


class TokenIssuer(Service):
    """An HTTP token endpoint on 127.0.0.1 in a background thread, signing with its own key."""

    def __init__(
        self,
        workdir: Path,
        *,
        users: dict[str, str],
        lifetime_s: int = 300,
        host: str = "127.0.0.1",
        tls: bool = False,
    ) -> None:
        """``host``: a loopback address to listen on (127.0.0.2 is "another host" than a
        registry on 127.0.0.1); ``tls``: HTTPS with a self-signed certificate for that
        address (``tls_cert_path``, the CA file a client trusts)."""
        self.workdir = workdir
        self.users = users
        self.lifetime_s = lifetime_s
        self.requests: list[TokenRequest] = []
        self.cert_path, self.key_path = make_certificate(workdir / "issuer", ISSUER)
        self.key_id = libtrust_key_id(self._public_key_der())
        self._server = ThreadingHTTPServer((host, 0), _handler_for(self))
        self.scheme = "https" if tls else "http"
        self.tls_cert_path: Path | None = None
        if tls:
            self.tls_cert_path, tls_key = make_certificate(workdir / "issuer-tls", host, ip=host)
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self.tls_cert_path, tls_key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def realm(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{self.scheme}://{host!s}:{port}/token"

    def config(self) -> TokenAuthConfig:
        """What the registry's `auth: token` section needs."""
        return TokenAuthConfig(self.realm, SERVICE, ISSUER, self.cert_path)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def issue(self, user: str | None, scope: str) -> str:
        """A signed JWT granting `user` what `scope` asks for (nothing when anonymous)."""
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": user or "",
            "aud": SERVICE,
            "exp": now + self.lifetime_s,
            "nbf": now - 5,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": _access(scope) if user is not None else [],
        }
        header = {"typ": "JWT", "alg": "RS256", "kid": self.key_id}
        signing_input = f"{_b64url(_json(header))}.{_b64url(_json(claims))}"
        return f"{signing_input}.{_b64url(self._sign(signing_input.encode()))}"

    def check(self, authorization: str | None) -> tuple[bool, str | None]:
        """(credentials acceptable, user): anonymous is acceptable, a wrong password is not."""
        if not authorization:
            return True, None
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False, None
        user, _, password = base64.b64decode(encoded).decode().partition(":")
        return self.users.get(user) == password, user

    def _sign(self, data: bytes) -> bytes:
        result = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.key_path)],
            input=data,
            check=True,
            capture_output=True,
        )
        return result.stdout

    def _public_key_der(self) -> bytes:
        result = subprocess.run(
            ["openssl", "pkey", "-in", str(self.key_path), "-pubout", "-outform", "DER"],
            check=True,
            capture_output=True,
        )
        return result.stdout


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _access(scope: str) -> list[dict[str, object]]:
    """`repository:NAME:ACTIONS` scopes (space separated) as JWT access entries."""
    entries: list[dict[str, object]] = []
    for item in scope.split():
        kind, _, rest = item.partition(":")
        name, _, actions = rest.rpartition(":")
        entries.append({"type": kind, "name": name, "actions": actions.split(",")})
    return entries


def _handler_for(issuer: TokenIssuer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            scope = " ".join(query.get("scope", []))
            service = query.get("service", [""])[0]
            authorization = self.headers.get("Authorization")
            ok, user = issuer.check(authorization)
            status = 200 if ok and service == SERVICE else 401
            issuer.requests.append(TokenRequest(user, scope, service, status, authorization))
            body = _json({"token": issuer.issue(user, scope), "expires_in": issuer.lifetime_s})
            self._answer(status, body if status == 200 else b'{"error":"unauthorized"}')

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # keep pytest's output clean; `requests` records what happened

    return Handler
