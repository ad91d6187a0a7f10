"""A throw-away OCI registry for integration tests: Debian's `docker-registry` (distribution v2).

`Registry(workdir)` writes a config into `workdir` (filesystem storage under
`workdir/storage`, deletes enabled, no auth, listening on 127.0.0.1 at a free port),
starts the binary with its output in `workdir/registry.log`, and waits until
`GET /v2/` answers (200, or 401 when auth is on). Use it as a context manager,
or call `start()`/`stop()`:

    with Registry(tmp_path) as registry:
        push(registry.url, "example/app", image)

Options, each independent of the others:

* `htpasswd_users={"alice": "secret"}`: basic auth (distribution's `htpasswd`
  module, bcrypt hashes made by Debian's `htpasswd -B`). distribution 2.8.2
  accepts basic auth over plain HTTP; it needs no TLS.
* `token_auth=TokenAuthConfig(...)`: bearer tokens from an issuer (see
  `tests/testenv/token_issuer.py`), verified against its certificate.
* `tls=True`: HTTPS with a self-signed certificate for 127.0.0.1 (`ca_file`).
* `client_ca=path, client_pair=(cert, key)`: with `tls=True`, mutual TLS: every client
  must present a certificate the CA file signed (distribution's `http.tls.clientcas`,
  which requires and verifies one); the readiness probe presents `client_pair`.
* `storage_root=other.root`: serve another registry's storage. `push()` speaks
  plain HTTP without auth, so tests push through an open registry and read
  through a protected one that shares its storage (distribution without a
  blob-descriptor cache reads the filesystem on every request).
* `address=link.netns_address, command_prefix=link.exec_prefix`: listen on
  another address, e.g. inside a network namespace behind an emulated link
  (`tests/testenv/link.py`), started through `ip netns exec`.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.testenv.lifecycle import Service
from tests.testenv.waiting import log_tail, wait_for

DEFAULT_BINARY = "/usr/bin/docker-registry"
_PORT_ATTEMPTS = 3  # the free port may be taken between probing it and the bind


class RegistryStartError(RuntimeError):
    """The registry process exited before it served `GET /v2/`."""


class _PortTaken(RegistryStartError):
    pass


@dataclass(frozen=True)
class TokenAuthConfig:
    """distribution's `auth: token` settings: who issues tokens and the cert that signs them."""

    realm: str
    service: str
    issuer: str
    root_cert_bundle: Path


def make_certificate(directory: Path, common_name: str, ip: str | None = None) -> tuple[Path, Path]:
    """A self-signed RSA certificate (and key) made with the `openssl` CLI; IP SAN if given."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "cert.pem", directory / "key.pem"
    extensions = ["-addext", f"subjectAltName=IP:{ip}"] if ip else []
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
    files = ["-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        [*command, "-subj", f"/CN={common_name}", *files, *extensions],
        check=True,
        capture_output=True,
    )
    return cert, key


def htpasswd_line(user: str, password: str) -> str:
    """One bcrypt htpasswd line (`htpasswd -B`, password on stdin, not on the command line)."""
    result = subprocess.run(
        ["htpasswd", "-B", "-i", "-n", user],
        input=password,
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Registry(Service):
    """One `docker-registry serve` process with its config, storage and log in `workdir`."""

    def __init__(
        self,
        workdir: Path,
        *,
        binary: str = DEFAULT_BINARY,
        startup_timeout_s: float = 20.0,
        stop_timeout_s: float = 5.0,
        htpasswd_users: dict[str, str] | None = None,
        token_auth: TokenAuthConfig | None = None,
        tls: bool = False,
        client_ca: Path | None = None,
        client_pair: tuple[Path, Path] | None = None,
        storage_root: Path | None = None,
        address: str = "127.0.0.1",
        command_prefix: Sequence[str] = (),
    ) -> None:
        if htpasswd_users is not None and token_auth is not None:
            raise ValueError("distribution takes one auth module: htpasswd or token, not both")
        self.workdir = workdir
        self.root = storage_root if storage_root is not None else workdir / "storage"
        self.htpasswd_users = htpasswd_users
        self.htpasswd_path = workdir / "htpasswd"
        self.token_auth = token_auth
        self.tls = tls
        self.tls_dir = workdir / "tls"
        if client_ca is not None and (not tls or client_pair is None):
            raise ValueError("mutual TLS needs tls=True and a client_pair for the probe")
        self.client_ca = client_ca
        self.client_pair = client_pair
        self.config_path = workdir / "config.yml"
        self.log_path = workdir / "registry.log"
        self.binary = binary
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.address = address
        self.command_prefix = list(command_prefix)
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._log_offset = 0  # where this launch's output starts in the appended log

    @property
    def host(self) -> str:
        """`127.0.0.1:PORT` (or `ADDRESS:PORT`), the registry part of an image reference."""
        return f"{self.address}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}"

    @property
    def ca_file(self) -> Path:
        """The self-signed certificate that `tls=True` serves: the CA file for clients."""
        return self.tls_dir / "cert.pem"

    @property
    def has_auth(self) -> bool:
        return self.htpasswd_users is not None or self.token_auth is not None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def config_text(self) -> str:
        """The YAML config (JSON-quoted scalars are valid YAML, so paths need no escaping)."""
        return "\n".join(
            [
                "version: 0.1",
                "log:",
                "  level: warn",
                "storage:",
                "  filesystem:",
                f"    rootdirectory: {json.dumps(str(self.root))}",
                "  delete:",
                "    enabled: true",
                "http:",
                f"  addr: {json.dumps(self.host)}",
                # A fixed secret keeps the "No HTTP secret provided" warning out of the log.
                "  secret: nodeagent-testenv",
                *self._tls_lines(),
                *self._auth_lines(),
                "",
            ]
        )

    def _tls_lines(self) -> list[str]:
        if not self.tls:
            return []
        return [
            "  tls:",
            f"    certificate: {json.dumps(str(self.tls_dir / 'cert.pem'))}",
            f"    key: {json.dumps(str(self.tls_dir / 'key.pem'))}",
            *(
                ["    clientcas:", f"      - {json.dumps(str(self.client_ca))}"]
                if self.client_ca
                else []
            ),
        ]

    def _auth_lines(self) -> list[str]:
        if self.htpasswd_users is not None:
            return [
                "auth:",
                "  htpasswd:",
                "    realm: nodeagent-testenv",
                f"    path: {json.dumps(str(self.htpasswd_path))}",
            ]
        if self.token_auth is not None:
            token = self.token_auth
            return [
                "auth:",
                "  token:",
                f"    realm: {json.dumps(token.realm)}",
                f"    service: {json.dumps(token.service)}",
                f"    issuer: {json.dumps(token.issuer)}",
                f"    rootcertbundle: {json.dumps(str(token.root_cert_bundle))}",
            ]
        return []

    def _write_secrets(self) -> None:
        if self.htpasswd_users is not None:
            lines = [htpasswd_line(user, pw) for user, pw in self.htpasswd_users.items()]
            self.htpasswd_path.write_text("".join(f"{line}\n" for line in lines))
        if self.tls and not self.ca_file.exists():
            make_certificate(self.tls_dir, "nodeagent-testenv-registry", ip=self.address)

    def start(self) -> None:
        """Launch the registry and wait until it serves `GET /v2/`; retry if the port was taken."""
        if self._process is not None:
            raise RuntimeError(f"registry already running with pid {self._process.pid}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_secrets()
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            try:
                self._launch()
                wait_for(
                    self._ready,
                    timeout_s=self.startup_timeout_s,
                    what=f"docker-registry to answer GET {self.url}/v2/",
                    detail=self.log_tail,
                )
            except _PortTaken:
                self.stop()
                if attempt == _PORT_ATTEMPTS:
                    raise
                self.port = free_port()
            except BaseException:
                self.stop()
                raise
            else:
                return

    def stop(self) -> None:
        """SIGTERM the registry, SIGKILL it after `stop_timeout_s`; safe to call twice."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def log_tail(self) -> str:
        return log_tail(self.log_path)

    def _launch(self) -> None:
        self.config_path.write_text(self.config_text())
        # REGISTRY_* variables override the config file; keep the caller's out of it.
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
        self._log_file = self.log_path.open("ab")
        self._log_offset = self._log_file.tell()
        self._process = subprocess.Popen(
            [*self.command_prefix, self.binary, "serve", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def _ready(self) -> bool:
        assert self._process is not None
        code = self._process.poll()
        if code is not None:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                output = log.read().decode(errors="replace")
            error = _PortTaken if "address already in use" in output else RegistryStartError
            raise error(f"docker-registry exited with code {code} before serving:\n{output}")
        conn = self._connection(timeout_s=1.0)
        try:
            conn.request("GET", "/v2/")
            # With auth on, an anonymous GET /v2/ is refused: that proves auth is active too.
            return conn.getresponse().status == (401 if self.has_auth else 200)
        except OSError:
            return False
        finally:
            conn.close()

    def _connection(self, *, timeout_s: float) -> http.client.HTTPConnection:
        if not self.tls:
            return http.client.HTTPConnection(self.address, self.port, timeout=timeout_s)
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if self.client_pair is not None:
            context.load_cert_chain(*self.client_pair)
        return http.client.HTTPSConnection(
            self.address, self.port, timeout=timeout_s, context=context
        )
