"""A private Kubernetes API server for tests: etcd + kube-apiserver on loopback, in a temp dir.

The layout under ``base`` (a temp dir the caller owns)::

    pki/ca.crt, ca.key             the cluster CA (signs serving and client certificates)
    pki/apiserver.crt, .key        serving certificate, SAN IP 127.0.0.1 and DNS localhost
    pki/sa.key, sa.pub             service-account token signing key pair
    pki/users/<name>.crt, .key     client certificates (admin, nodes, any user)
    kubeconfigs/<name>.yaml        one kubeconfig per identity, certificates embedded
    etcd/                          etcd's data directory
    etcd.log, kube-apiserver.log   the two processes' logs (appended across restarts)
    kubectl-cache/                 kubectl's discovery cache (never ~/.kube)

Only client certificates authenticate (no anonymous requests, no tokens for people),
authorization is ``Node,RBAC`` and the NodeRestriction admission plugin is on, as on a
real cluster's control plane, so a test that acts as a kubelet's identity is held to what
a kubelet may do. The API server can be stopped and started again on the same port with
the same certificates while etcd keeps the data.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.testenv.kube_build import KUBE, KubeRelease, ensure_kube
from tests.testenv.packages import ensure_packages
from tests.testenv.waiting import log_tail, wait_for

ETCD_BINARY = "/usr/bin/etcd"  # Debian's etcd-server (tests/testenv/packages.py)
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"
SERVICE_CIDR = "10.96.0.0/16"  # allocation bookkeeping only: nothing is routed there
ADMIN_USER = "nodeagent-test-admin"
_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Identity:
    """A client certificate's subject: the user (CN) and groups (O) the API server sees."""

    user: str
    groups: tuple[str, ...] = ()

    @property
    def file_stem(self) -> str:
        safe = "".join(c if c.isalnum() or c in "-." else "_" for c in self.user)
        return safe + ("@" + "+".join(self.groups) if self.groups else "")


def _free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago (held together)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class _CertificateAuthority:
    """A self-signed CA made with ``cryptography``; issues serving and client certificates."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.cert_path = directory / "ca.crt"
        self.key_path = directory / "ca.key"
        directory.mkdir(parents=True, exist_ok=True)
        self.key: ec.EllipticCurvePrivateKey
        if self.cert_path.exists():
            key = serialization.load_pem_private_key(self.key_path.read_bytes(), None)
            assert isinstance(key, ec.EllipticCurvePrivateKey)
            self.key = key
            self.cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            return
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nodeagent-test-kube-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        self.key_path.write_bytes(_pem_key(self.key))
        self.cert_path.write_bytes(_pem_cert(self.cert))

    def issue(
        self,
        cert_path: Path,
        key_path: Path,
        *,
        subject: x509.Name,
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
    ) -> None:
        """Write a leaf certificate and its key: a server's if names are given, else a client's."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        is_server = bool(server_names or server_ips)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if is_server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if is_server:
            alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path.parent.mkdir(parents=True, exist_ok=True)
        key_path.write_bytes(_pem_key(key))
        key_path.chmod(0o600)
        cert_path.write_bytes(_pem_cert(cert))


class _Process:
    """One child process with its output appended to a log file; stopped by its own PID."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None
        self.log_offset = 0

    def start(self, cmd: list[str]) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"----- {' '.join(cmd)}\n".encode())
            log.flush()
            self.log_offset = log.tell()
            self.popen = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )

    def check_alive(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with code {self.popen.returncode}\n{self.output()}"
            )

    def output(self) -> str:
        """What this run of the process wrote (the log since the last start), last 6000 bytes."""
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace")[-6000:]

    def stop(self, timeout_s: float = 20.0) -> None:
        popen, self.popen = self.popen, None
        if popen is None or popen.poll() is not None:
            return
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class KubeCluster:
    """etcd plus kube-apiserver under ``base``; ``start``/``stop`` or use as a context manager."""

    def __init__(
        self, base: Path, *, release: KubeRelease = KUBE, extra_args: tuple[str, ...] = ()
    ) -> None:
        """``extra_args``: more kube-apiserver flags, appended after the fixed ones (a later
        flag wins), e.g. ``("--watch-cache=false",)`` for watches served from etcd."""
        self.base = base
        self.release = release
        self.extra_args = tuple(extra_args)
        self.pki = base / "pki"
        self.kubeconfig_dir = base / "kubeconfigs"
        self.etcd_data = base / "etcd"
        self.etcd_log = base / "etcd.log"
        self.apiserver_log = base / "kube-apiserver.log"
        self.kubectl_cache = base / "kubectl-cache"
        self.port, self.etcd_client_port, self.etcd_peer_port = _free_ports(3)
        self._etcd = _Process("etcd", self.etcd_log)
        self._apiserver = _Process("kube-apiserver", self.apiserver_log)
        self._ca: _CertificateAuthority | None = None
        self._kubeconfigs: dict[Identity, Path] = {}
        bin_dir = ensure_kube(release)
        self.apiserver_binary = bin_dir / "kube-apiserver"
        self.kubectl_binary = bin_dir / "kubectl"

    # ------------------------------------------------------------ addresses and files
    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_client_port}"

    @property
    def admin_kubeconfig(self) -> Path:
        """A kubeconfig whose user is in ``system:masters`` (every permission)."""
        return self.kubeconfig_for(ADMIN_USER, ["system:masters"])

    def kubeconfig_for_node(self, name: str) -> Path:
        """A kubeconfig with a kubelet's identity: ``system:node:<name>`` in ``system:nodes``."""
        return self.kubeconfig_for(f"system:node:{name}", ["system:nodes"])

    def kubeconfig_for(self, user: str, groups: list[str] | tuple[str, ...] = ()) -> Path:
        """A kubeconfig with a client certificate for ``user`` (CN) in ``groups`` (O)."""
        identity = Identity(user, tuple(groups))
        found = self._kubeconfigs.get(identity)
        if found is not None:
            return found
        cert, key = self._client_certificate(identity)
        path = self.kubeconfig_dir / f"{identity.file_stem}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self._kubeconfig_text(identity, cert, key))
        path.chmod(0o600)
        self._kubeconfigs[identity] = path
        return path

    def client_certificate(
        self, user: str, groups: list[str] | tuple[str, ...] = ()
    ) -> tuple[Path, Path]:
        """The (certificate, key) files of ``user`` in ``groups``, for clients of plain HTTPS."""
        return self._client_certificate(Identity(user, tuple(groups)))

    def _client_certificate(self, identity: Identity) -> tuple[Path, Path]:
        cert = self.pki / "users" / f"{identity.file_stem}.crt"
        key = cert.with_suffix(".key")
        if not cert.exists():
            attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in identity.groups]
            attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, identity.user))
            self._authority().issue(cert, key, subject=x509.Name(attributes))
        return cert, key

    def _kubeconfig_text(self, identity: Identity, cert: Path, key: Path) -> str:
        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "nodeagent-test",
                    "cluster": {
                        "server": self.server_url,
                        "certificate-authority-data": b64(self.ca_file),
                    },
                }
            ],
            "users": [
                {
                    "name": identity.user,
                    "user": {
                        "client-certificate-data": b64(cert),
                        "client-key-data": b64(key),
                    },
                }
            ],
            "contexts": [
                {"name": "test", "context": {"cluster": "nodeagent-test", "user": identity.user}}
            ],
            "current-context": "test",
        }
        return json.dumps(config, indent=2) + "\n"  # JSON is YAML: every client reads it

    def _authority(self) -> _CertificateAuthority:
        if self._ca is None:
            self._ca = _CertificateAuthority(self.pki)
        return self._ca

    def _write_pki(self) -> None:
        ca = self._authority()
        serving = self.pki / "apiserver.crt"
        if not serving.exists():
            subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
            ca.issue(
                serving,
                serving.with_suffix(".key"),
                subject=subject,
                server_names=("localhost",),
                server_ips=("127.0.0.1",),
            )
        sa_key = self.pki / "sa.key"
        if not sa_key.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            public = key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            (self.pki / "sa.pub").write_bytes(public)
            sa_key.write_bytes(_pem_key(key))
            sa_key.chmod(0o600)

    # ------------------------------------------------------------ processes
    def start(self, *, timeout_s: float = 90.0) -> None:
        """Start etcd and the API server; return once ``/readyz`` answers ``ok``."""
        ensure_packages()
        self.base.mkdir(parents=True, exist_ok=True)
        self._write_pki()
        self.admin_kubeconfig  # noqa: B018 - issue the admin certificate before the first probe
        self._start_etcd(timeout_s=timeout_s)
        self.start_apiserver(timeout_s=timeout_s)

    def _start_etcd(self, *, timeout_s: float) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self._etcd.start(
            [
                ETCD_BINARY,
                "--name=nodeagent-test",
                f"--data-dir={self.etcd_data}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=nodeagent-test={peer}",
                "--initial-cluster-state=new",
                "--logger=zap",
                "--log-level=warn",
            ]
        )
        wait_for(
            self._etcd_healthy,
            timeout_s=timeout_s,
            interval_s=0.05,
            what=f"etcd to report healthy at {self.etcd_url}/health",
            detail=lambda: log_tail(self.etcd_log),
        )

    def _etcd_healthy(self) -> bool:
        self._etcd.check_alive()
        conn = http.client.HTTPConnection("127.0.0.1", self.etcd_client_port, timeout=2)
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            body = response.read()
        except OSError:
            return False
        finally:
            conn.close()
        return response.status == 200 and json.loads(body).get("health") == "true"

    def _etcd_call(self, path: str, body: dict[str, object]) -> dict[str, object]:
        """POST to etcd's v3 JSON gateway (on its client URL, loopback, plain HTTP)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.etcd_client_port, timeout=10)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        if response.status != 200:
            raise RuntimeError(f"etcd {path}: HTTP {response.status}: {data[:500]!r}")
        answer: dict[str, object] = json.loads(data)
        return answer

    def etcd_revision(self) -> int:
        """etcd's current revision (a resourceVersion the API server hands out is one)."""
        header = self._etcd_call("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})
        return int(header["header"]["revision"])  # type: ignore[index]

    def compact_etcd(self, revision: int | None = None) -> int:
        """Compact etcd's history up to ``revision`` (default: the current one) and return it.

        A watch from an older resourceVersion then fails with 410 Expired, but only where
        the API server watches etcd itself: its watch cache (on by default) answers from
        memory, so pass ``--watch-cache=false`` in ``extra_args`` to see it.
        """
        target = self.etcd_revision() if revision is None else revision
        self._etcd_call("/v3/kv/compaction", {"revision": str(target), "physical": True})
        return target

    def apiserver_args(self) -> list[str]:
        pki = self.pki
        return [
            str(self.apiserver_binary),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self.ca_file}",
            "--anonymous-auth=false",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--etcd-servers={self.etcd_url}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # A loopback address may not stand in an Endpoints object: no endpoint reconciling.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
            *self.extra_args,
        ]

    def start_apiserver(self, *, timeout_s: float = 90.0) -> None:
        """Start kube-apiserver (same port, certificates and etcd as before); wait for /readyz."""
        if self._apiserver.running:
            raise RuntimeError("kube-apiserver is already running")
        self._etcd.check_alive()
        self._apiserver.start(self.apiserver_args())
        wait_for(
            self._ready,
            timeout_s=timeout_s,
            interval_s=0.1,
            what=f"kube-apiserver to answer GET {self.server_url}/readyz with ok",
            detail=lambda: log_tail(self.apiserver_log),
        )

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver only: etcd and its data stay, the port stays reserved for us."""
        self._apiserver.stop()

    @property
    def apiserver_pid(self) -> int:
        assert self._apiserver.popen is not None, "kube-apiserver is not running"
        return self._apiserver.popen.pid

    @property
    def etcd_pid(self) -> int:
        assert self._etcd.popen is not None, "etcd is not running"
        return self._etcd.popen.pid

    @property
    def apiserver_running(self) -> bool:
        return self._apiserver.running

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        cert, key = self._client_certificate(Identity(ADMIN_USER, ("system:masters",)))
        context.load_cert_chain(str(cert), str(key))
        return context

    def _ready(self) -> bool:
        self._apiserver.check_alive()
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self.port, timeout=2, context=self._ssl_context()
        )
        try:
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            return response.status == 200 and response.read() == b"ok"
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        """Stop both processes (the temp dir and its logs stay for the caller to inspect)."""
        self._apiserver.stop()
        self._etcd.stop()

    def __enter__(self) -> KubeCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------ clients
    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        timeout_s: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl (admin unless ``kubeconfig`` is given); never raises on failure."""
        cmd = [
            str(self.kubectl_binary),
            f"--kubeconfig={kubeconfig or self.admin_kubeconfig}",
            f"--cache-dir={self.kubectl_cache}",
            *args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        return subprocess.run(
            cmd,
            input=input,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
        )

    def kubectl_ok(
        self, *args: str, kubeconfig: Path | None = None, input: str | None = None
    ) -> str:
        """Run kubectl and return its stdout; raise with its stderr when it fails."""
        result = self.kubectl(*args, kubeconfig=kubeconfig, input=input)
        if result.returncode != 0:
            raise RuntimeError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}"
            )
        return result.stdout

    def create_node(self, name: str, labels: dict[str, str] | None = None) -> dict[str, object]:
        """Create a Node object as admin (no kubelet behind it); return the created object."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels or {}},
        }
        out = self.kubectl_ok("create", "-o", "json", "-f", "-", input=json.dumps(node))
        created: dict[str, object] = json.loads(out)
        return created

    def set_internal_address(self, node: str, address: str) -> None:
        """Node ``node``'s status says ``address`` is its InternalIP (as a kubelet reports)."""
        patch = json.dumps({"status": {"addresses": [{"type": "InternalIP", "address": address}]}})
        self.kubectl_ok("patch", "node", node, "--subresource=status", "--type=merge", "-p", patch)

    def log_tail(self) -> str:
        """The ends of both logs, for failure messages."""
        return log_tail(self.apiserver_log) + "\n" + log_tail(self.etcd_log)
