"""One site node for the multi-node tests: a root directory, certificates, CRI-O, nodeagent.

``SiteNode(base, host, name=..., ca=..., peers=[...])`` lays out a node under ``base`` the
way a host has it, and runs ``nodeagent --root <base> run`` inside the node's network
namespace (``host``, from ``SiteNetwork``), so every path in its config is written as on a
host (``/var/lib/...``) and re-rooted by the daemon::

    etc/nodeagent/config.toml                  [runtime] (with CRI-O), [bundles], [site]
    var/lib/kubelet/pki/kubelet-server-current.pem   node certificate + key (site_pki)
    var/lib/kubelet/pki/kubelet-client-current.pem   the same, as the kubelet has two
    etc/kubernetes/kubelet-ca.crt              the CA bundle peers are checked against
    var/lib/nodeagent/                         state dir; its store/ is the node's store
    var/lib/kubelet/kubeconfig                 the node's identity (cluster mode)
    crio/                                      this node's CRI-O (``with_crio=True``)
    nodeagent.log                              the daemon's output, one section a run

The certificate paths are ``[site]``'s defaults (the kubelet's), so the config names none
of them. ``with_crio=True`` starts a private CRI-O (``tests/testenv/crio.py``) in the same
namespace, with its own storage root and socket; its CNI directory is empty, which CRI-O
accepts as long as no pod sandbox is made (image tests never make one).

Without CRI-O (``with_crio=False``, the benchmark's store-only nodes) the daemon runs
all the same: its sync loop waits for the runtime (``runtime_awaited`` at info, retried up
to every 60 s), and what does not need the runtime (the store, media; the peer server and
the fetcher as issue 15 describes them) can work. Pinning needs a runtime, so a store-only
node never reports a bundle pinned.

The stick: ``stick_udevd(workdir, host)`` makes the node udevd
(``tests/testenv/node_udevd.py``) of node 0's namespace, started before the nodes. udevd
re-broadcasts device events on a netlink socket, which belongs to its network namespace, so
only node 0's daemon hears them; a ``LoopMedia`` attached then is node 0's stick. That
udevd has a ``/run/udev`` of its own, so it runs the same beside a host's udevd (any
systemd-booted machine); the nodes that may have the stick (``has_stick=True``) run over
that database, and a node without the stick (the default) runs its daemon over an empty
``/run/udev`` of its own (a tmpfs in the private mount namespace ``ip netns exec`` gives
it): enumerating block devices at start finds no medium either.

With ``serve`` (the default) the node's peer server runs next to the daemon as
``nodeagent-peer.service`` runs it on a host: ``nodeagent serve-peers`` as another uid and
gid with no capability, the state directory hidden but for the store (read-only), the
TLS files copied as credentials at each start (``tests/testenv/peer_process.py``); its
output goes to the same log. The node's directories are prepared as the package's
tmpfiles entries leave them (the store ``2750 root:<peer group>``) when the node is made,
so a store a test writes before the start is the peer's to read; the daemon runs with the
unit's ``UMask=0027``.

Starting waits on a condition with a deadline (a log line of this run, or the peer port
listening inside the namespace), never for a fixed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.testenv.crio import Crio
from tests.testenv.node_udevd import NodeUdevd, active
from tests.testenv.peer_process import VIEW, load_credentials, peer_command, prepare_node
from tests.testenv.site_net import SiteHost
from tests.testenv.site_pki import Issued, issue_node_cert, write_ca, write_pem_bundle
from tests.testenv.udev import RUN_UDEV, TEST_MEDIA_CONFIG, TEST_SESSION_CONFIG
from tests.testenv.waiting import log_tail, wait_for

REPO = Path(__file__).resolve().parents[2]
SITE_PORT = 9447
SERVER_PEM = "var/lib/kubelet/pki/kubelet-server-current.pem"
CLIENT_PEM = "var/lib/kubelet/pki/kubelet-client-current.pem"
CA_BUNDLE = "etc/kubernetes/kubelet-ca.crt"
STATE_DIR = "var/lib/nodeagent"
KUBECONFIG = "var/lib/kubelet/kubeconfig"
NO_UDEV = f'mount -t tmpfs -o mode=0755,nosuid,nodev nodeagent-no-udev {RUN_UDEV} && exec "$@"'
"""Shell run first by a node without the stick: an empty udev database of its own."""


def stick_udevd(workdir: Path, host: SiteHost) -> NodeUdevd:
    """A udevd (not started yet) whose events only ``host``'s namespace receives."""
    return NodeUdevd(workdir, host.exec_prefix)


def _toml_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


class SiteNode:
    """A node's files and processes; ``start``/``stop``/``restart``/``kill``, ``with``."""

    def __init__(
        self,
        base: Path,
        host: SiteHost,
        *,
        name: str,
        ca: Issued,
        peers: Sequence[str] = (),
        serve: bool = True,
        serve_mirror: bool = False,
        with_crio: bool = False,
        watch_media: bool = False,
        has_stick: bool = False,
        trusted_keys: Sequence[str] = (),
        kubeconfig: Path | None = None,
        cluster_settings: str = "",
        extra_config: str = "",
        daemon_env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = base
        self.host = host
        self.name = name
        self.ca = ca
        self.peers = list(peers)
        self.serve = serve
        self.serve_mirror = serve_mirror
        """Also run ``nodeagent serve-mirror`` (the node mirror's own process, which
        nodeagent-mirror.socket starts on the first connection: here at once)."""
        self.has_stick = has_stick
        self.watch_media = watch_media or has_stick
        self.trusted_keys = list(trusted_keys)
        self.kubeconfig = kubeconfig
        """Cluster mode: this identity's kubeconfig (``KubeCluster.kubeconfig_for_node``),
        copied to the kubelet's path; reach the API server through ``ns_relay.KubeRelay``."""
        self.cluster_settings = cluster_settings
        """More ``[cluster]`` lines (``set_selector = ...``)."""
        self.extra_config = extra_config
        self.daemon_env = dict(daemon_env or {})
        """More environment for the daemon's process alone, not its peer process or CRI-O
        (``tests/testenv/faketime.py``: the daemon's wall clock stepped)."""
        prepare_node(base)  # as the package leaves a host: a store written now is shared
        self.crio = Crio(base / "crio", command_prefix=host.exec_prefix) if with_crio else None
        self.config_file = base / "etc/nodeagent/config.toml"
        self.state_dir = base / STATE_DIR
        self.log_path = base / "nodeagent.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.peer: subprocess.Popen[bytes] | None = None
        """The peer server's process (``serve``), unprivileged, as nodeagent-peer.service
        runs it (``tests/testenv/peer_process.py``)."""
        self.mirror: subprocess.Popen[bytes] | None = None
        """The node mirror's process (``serve_mirror``), unprivileged, as
        nodeagent-mirror.service runs it (no credential)."""
        self.runs = 0
        self.python = sys.executable
        self.extra_env: dict[str, str] = {}
        """More environment for the daemon, set after the service's is cleaned
        (``NOTIFY_SOCKET`` of a test's ``NotifyListener``: systemd's ``STATUS=`` line)."""

    @property
    def address(self) -> str:
        """``host:port`` of this node's peer server, as its peers list it."""
        return f"{self.host.address}:{SITE_PORT}"

    def path(self, host_path: str) -> Path:
        """A host path (``/var/lib/...``) as it lies under this node's root."""
        return self.root / host_path.lstrip("/")

    # ------------------------------------------------------------ files
    def write_certificates(
        self, *, server: Issued | None = None, client: Issued | None = None
    ) -> None:
        """The node's certificate (issued by ``ca`` unless given) in the kubelet's two files,
        and ``ca`` as the trust bundle."""
        issued = issue_node_cert(self.ca, self.name, [self.host.address])
        write_pem_bundle(self.path(SERVER_PEM), server or issued)
        write_pem_bundle(self.path(CLIENT_PEM), client or issued)
        write_ca(self.path(CA_BUNDLE), self.ca)

    def write_config(self) -> None:
        for d in ("etc/nodeagent/pinnedimagesets.d", "etc/crio/crio.conf.d", STATE_DIR):
            self.path(d).mkdir(parents=True, exist_ok=True)
        keys = self.path("etc/nodeagent/trusted-keys.d")
        keys.mkdir(parents=True, exist_ok=True)
        for i, key in enumerate(self.trusted_keys):
            (keys / f"site-{i}.pub").write_text(key)
        self.config_file.write_text(
            f"""# site node {self.name} (tests/testenv/site_node.py); host paths, re-rooted
{self._runtime_section()}
[pull]
backoff_initial_s = 0.2
backoff_max_s = 1.0

[disk]
reserve_bytes = "16MiB"
reserve_percent = 0.0

[bundles]
watch_media = {json.dumps(self.watch_media)}
{TEST_MEDIA_CONFIG}
{TEST_SESSION_CONFIG}

[site]
serve = {json.dumps(self.serve)}
listen = "{self.host.address}:{SITE_PORT}"
peers = {_toml_list(self.peers)}
{self._cluster_section()}
{self.extra_config}
"""
        )

    def _cluster_section(self) -> str:
        if self.kubeconfig is None:
            return ""
        target = self.path(KUBECONFIG)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(self.kubeconfig.read_bytes())
        return f"""
[cluster]
enabled = true
node_name = "{self.name}"
status_interval_s = 0.5
heartbeat_s = 2.0
request_timeout_s = 10.0
{self.cluster_settings}
"""

    def _runtime_section(self) -> str:
        if self.crio is None:
            return "[runtime]\nreload_timeout_s = 30.0\n"
        c = self.crio

        def rel(path: Path) -> str:
            return "/" + str(path.relative_to(self.root))

        return f"""[runtime]
endpoint = "unix://{rel(c.socket)}"
config_file = "{rel(c.config_file)}"
config_dir = "{rel(c.dropin_dir)}"
pid_file = "{rel(c.pid_file)}"
registries_conf = "{rel(c.registries_conf)}"
registries_dir = "{rel(c.registries_dir)}"
reload_timeout_s = 30.0
"""

    # ------------------------------------------------------------ processes
    def env(self) -> dict[str, str]:
        # No systemd bus: a reload takes the SIGHUP path (pid_file), as tests/testenv/agent.py.
        env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=f"unix:path={self.root}/no-bus")
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM"):
            env.pop(name, None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["MALLOC_ARENA_MAX"] = "2"  # as systemd/nodeagent.service sets it
        return env | self.extra_env

    @property
    def exec_prefix(self) -> list[str]:
        """Prepend to run a command as this node's daemon runs: in its network namespace,
        over the stick's udev database if it may have the stick, an empty one otherwise."""
        stick = active()
        if self.has_stick and stick is not None:
            return stick.view_prefix(self.host.exec_prefix)
        if self.has_stick or not RUN_UDEV.is_dir():
            return self.host.exec_prefix
        return [*self.host.exec_prefix, "sh", "-c", NO_UDEV, "sh"]

    def command(self, *args: str) -> list[str]:
        """``nodeagent --root <root> ARGS`` as this node runs it."""
        return [
            *self.exec_prefix,
            self.python,
            "-m",
            "nodeagent",
            "--root",
            str(self.root),
            *args,
        ]

    def cli(
        self, *args: str, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``nodeagent ARGS`` on this node; ``env``: more environment for it."""
        return subprocess.run(
            self.command(*args),
            capture_output=True,
            text=True,
            env=self.env() | dict(env or {}),
            check=False,
            cwd=self.root,
        )

    def start(
        self,
        *,
        ready: str | None = "daemon_started",
        timeout_s: float = 60.0,
        with_crio: bool = True,
    ) -> None:
        """Start CRI-O (if any, not running, and ``with_crio``) and the daemon; wait for
        ``ready`` in this run's log (``None``: do not wait). ``with_crio=False``: the boot
        order, where CRI-O starts after the daemon is ready (the caller starts it)."""
        if not self.config_file.exists():
            self.write_config()
        if not self.path(CA_BUNDLE).exists():
            self.write_certificates()
        if with_crio and self.crio is not None and self.crio.process is None:
            self.crio.start()
        self.runs += 1
        prepare_node(self.root)
        with self.log_path.open("ab") as log:
            log.write(f"----- run {self.runs} -----\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command("run"),
                stdout=log,
                stderr=log,
                env=self.env() | self.daemon_env,
                cwd=self.root,
                umask=0o027,  # as systemd/nodeagent.service
            )
            if self.serve:
                self.peer = self._start_peer(log)
            if self.serve_mirror:
                self.mirror = subprocess.Popen(
                    self.peer_command("serve-mirror"),
                    stdout=log,
                    stderr=log,
                    env=self.env(),
                    cwd="/",
                    umask=0o077,  # as systemd/nodeagent-mirror.service
                )
        if ready is not None:
            self.wait_log(ready, timeout_s=timeout_s)

    def peer_command(self, *args: str) -> list[str]:
        """``nodeagent --root <view> ARGS`` as the peer's unit runs it (unprivileged)."""
        argv = [self.python, "-m", "nodeagent", "--root", f"{VIEW}/root", *args]
        return [*self.exec_prefix, *peer_command(self.root, argv)]

    def _start_peer(self, log: Any) -> subprocess.Popen[bytes]:
        credentials = load_credentials(self.root)
        env = dict(self.env(), CREDENTIALS_DIRECTORY=str(credentials))
        return subprocess.Popen(
            self.peer_command("serve-peers"),
            stdout=log,
            stderr=log,
            env=env,
            cwd="/",
            umask=0o077,  # as systemd/nodeagent-peer.service
        )

    def stop_peer(self, *, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the peer server's process and wait; its exit code (None: not running)."""
        process, self.peer = self.peer, None
        mirror, self.mirror = self.mirror, None
        _stopped(mirror, timeout_s)
        return _stopped(process, timeout_s)

    def stop(self, *, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the peer process and the daemon and wait; the daemon's exit code (None if
        it was not running)."""
        self.stop_peer(timeout_s=timeout_s)
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
        return process.wait()

    def kill(self) -> None:
        """SIGKILL the daemon and the peer process: a crash or a power cut, as far as its
        files are concerned."""
        for process in (self.peer, self.mirror):
            if process is not None:
                process.kill()
                process.wait()
        self.peer = self.mirror = None
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def restart(self, *, ready: str | None = "daemon_started", timeout_s: float = 60.0) -> None:
        self.stop()
        self.start(ready=ready, timeout_s=timeout_s)

    def close(self) -> None:
        """Stop the daemon, then CRI-O."""
        self.stop()
        if self.crio is not None:
            self.crio.cleanup()

    def __enter__(self) -> SiteNode:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------ observing
    def current_run_log(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text.rsplit(f"----- run {self.runs} -----\n", 1)[-1]

    def _check_running(self) -> None:
        running = (("nodeagent", self.process), ("serve-peers", self.peer))
        for what, process in (*running, ("serve-mirror", self.mirror)):
            if process is not None and process.poll() is not None:
                raise AssertionError(
                    f"{what} on {self.name} exited with {process.returncode}\n"
                    + log_tail(self.log_path)
                )

    def wait_log(self, needle: str, *, timeout_s: float = 60.0) -> None:
        def logged() -> bool:
            if needle in self.current_run_log():
                return True
            self._check_running()
            return False

        wait_for(
            logged,
            timeout_s=timeout_s,
            what=f"{needle!r} in {self.name}'s log",
            detail=lambda: log_tail(self.log_path),
        )

    def is_listening(self, port: int = SITE_PORT) -> bool:
        """Whether a socket listens on ``port`` inside the node's namespace (``ss``)."""
        out = self.host.run("ss", "-Hltn", f"sport = :{port}").stdout
        return bool(out.strip())

    def wait_listening(self, port: int = SITE_PORT, *, timeout_s: float = 60.0) -> None:
        def listening() -> bool:
            self._check_running()
            return self.is_listening(port)

        wait_for(
            listening,
            timeout_s=timeout_s,
            what=f"{self.name} to listen on :{port}",
            detail=lambda: log_tail(self.log_path),
        )

    def status(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads((self.state_dir / "status.json").read_text()))
        except (OSError, json.JSONDecodeError):
            return None

    def wait_status(
        self, predicate: Callable[[dict[str, Any]], bool], *, what: str, timeout_s: float = 120.0
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            self._check_running()
            status = self.status()
            return status if status is not None and predicate(status) else None

        return wait_for(
            check,
            timeout_s=timeout_s,
            interval_s=0.1,
            what=f"{self.name}: {what}",
            detail=lambda: f"status: {self.status()}\n{log_tail(self.log_path)}",
        )


def _stopped(process: subprocess.Popen[bytes] | None, timeout_s: float) -> int | None:
    if process is None:
        return None
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()
