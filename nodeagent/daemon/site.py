"""``nodeagent serve-peers``: the peer server in a process of its own (decision 0056); and
the reports both unprivileged servers send to the daemon (``Reporter``), and the node
mirror's making (``build_mirror``), which ``nodeagent serve-mirror`` runs in its own
process (``daemon.mirror_process``, decision 0063).

systemd starts it as ``nodeagent-peer.service``: an unprivileged user (``nodeagent-peer``)
with no capabilities, whose group can read the store (and nothing else of nodeagent's
state), that cannot write to it, and that is given the serving certificate, its key and
the CA as credentials (``LoadCredential=``: ``$CREDENTIALS_DIRECTORY/peer-cert``,
``peer-key``, ``peer-ca``; without them, the ``[site]`` paths). When the kubelet rotates
its certificate, ``nodeagent-peer-tls.path`` restarts the unit, which copies the new files.

It serves ``[site] listen`` (with ``[site] serve``) until SIGTERM (``READY=1`` once it
listens; without its TLS files it says so, ``peer_server_waiting_for_tls``, and exits 1),
and reports to the daemon, never acting itself: a blob that fails its digest while it is
sent (the daemon checks and removes it), and the bytes it served (the daemon's metrics). A
report the daemon could not take is kept (at most ``MAX_PENDING``) and sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

import structlog

from nodeagent.adapters.http.node_mirror import NodeMirror, mirror_caps
from nodeagent.adapters.http.peer import PeerServer, peer_caps
from nodeagent.adapters.http.tls import ReloadingTls
from nodeagent.adapters.peer_reports import ReportSender
from nodeagent.adapters.systemd import Notifier
from nodeagent.config import Config
from nodeagent.config.addresses import parse_address
from nodeagent.config.site import SiteSettings
from nodeagent.daemon.peer_reports import report_socket_path
from nodeagent.mirror.credentials import VERIFIER_NAME
from nodeagent.site.reports import (
    MirrorReport,
    render_corrupt,
    render_mirror,
    render_missing,
    render_served,
)
from nodeagent.site.roles import is_following

log = structlog.get_logger(__name__)

CREDENTIALS: Final = ("peer-cert", "peer-key", "peer-ca")
"""The credentials' names (``LoadCredential=`` in systemd/nodeagent-peer.service)."""
REPORT_INTERVAL_S: Final = 15.0
"""How often the bytes served are reported, and reports not taken are sent again."""
MAX_PENDING: Final = 256
"""Corrupt blobs kept to be reported again while the daemon does not take them."""
MAX_MISSING_PER_INTERVAL: Final = 32
"""Missing digests reported per report interval at most (each is logged here anyway)."""


def node_name(config: Config) -> str:
    """The name peers see in ``holdings``: the Node's (as cluster mode names it)."""
    return config.cluster.node_name or socket.gethostname().split(".")[0].lower()


def tls_files(site: SiteSettings, environ: Mapping[str, str]) -> tuple[Path, Path, Path]:
    """(certificate, key, CA): each from ``$CREDENTIALS_DIRECTORY`` when systemd passed it
    there, else the ``[site]`` setting."""
    configured = (site.cert_file, site.key_file, site.ca_file)
    directory = environ.get("CREDENTIALS_DIRECTORY", "")
    if not directory:
        return configured
    found = [Path(directory) / name for name in CREDENTIALS]
    cert, key, ca = (c if c.is_file() else p for c, p in zip(found, configured, strict=True))
    return cert, key, ca


class Reporter:
    """The peer server's reports to the daemon; those it did not take are sent again."""

    def __init__(self, sender: ReportSender) -> None:
        self._sender = sender
        self._pending: dict[str, None] = {}
        self._served_unsent = 0
        self._is_failing = False
        self._missing_sent = 0
        self.mirror_state: Callable[[], MirrorReport] | None = None
        """The node mirror's state now, sent with each missing digest (the counts agree)."""

    def corrupt(self, digest: str) -> bool:
        """``PeerServer``'s ``on_corrupt`` (called in a thread)."""
        is_sent = self._send(render_corrupt(digest))
        if not is_sent and len(self._pending) < MAX_PENDING:
            self._pending[digest] = None
        return is_sent

    def flush(self, served_bytes: int) -> None:
        """Report ``served_bytes`` more, and what was not taken before."""
        self._served_unsent += served_bytes
        if self._served_unsent and self._send(render_served(self._served_unsent)):
            self._served_unsent = 0
        for digest in list(self._pending):
            if not self._send(render_corrupt(digest)):
                return
            del self._pending[digest]

    def missing(self, digest: str) -> None:
        """The node mirror's ``on_missing``: a digest the store lacks, at most once a minute
        each, at most ``MAX_MISSING_PER_INTERVAL`` an interval (status only: not kept)."""
        if self._missing_sent < MAX_MISSING_PER_INTERVAL:
            self._missing_sent += 1
            self._send(render_missing(digest))
            if self.mirror_state is not None:
                self._send(render_mirror(self.mirror_state()))

    def mirror(self, report: MirrorReport) -> None:
        """The node mirror's state, each interval (status only: the next one replaces it)."""
        self._missing_sent = 0
        self._send(render_mirror(report))

    def _send(self, data: bytes) -> bool:
        is_sent = self._sender.send(data)
        if is_sent == self._is_failing:  # a transition: said once
            self._is_failing = not is_sent
            if is_sent:
                log.info("peer_reports_delivered", socket=str(self._sender.path))
            else:
                log.warning("peer_report_not_delivered", socket=str(self._sender.path))
        return is_sent


def build_server(config: Config, environ: Mapping[str, str], reporter: Reporter) -> PeerServer:
    site = config.site
    address = parse_address(site.listen)  # checked when the configuration was loaded
    tls = ReloadingTls(*tls_files(site, environ))
    return PeerServer(
        config.store_dir,
        tls,
        node=node_name(config),
        host=address.host,
        port=address.port,
        max_uploads=site.max_uploads,
        upload_max_bytes=site.upload_max_bytes,
        request_timeout_s=site.request_timeout_s,
        caps=peer_caps(site),
        handshake_timeout_s=site.handshake_timeout_s,
        on_corrupt=reporter.corrupt,
    )


def build_mirror(
    config: Config, reporter: Reporter, *, sock: socket.socket | None = None
) -> NodeMirror:
    """The node mirror (``nodeagent serve-mirror``, decision 0063) on ``sock`` when systemd
    passed one, else on ``[mirror] listen``."""
    address = parse_address(config.mirror.listen)  # a loopback address, checked at load
    return NodeMirror(
        config.store_dir,
        host=address.host,
        port=address.port,
        verifiers_file=report_socket_path(config).parent / VERIFIER_NAME,
        caps=mirror_caps(config.mirror),
        request_timeout_s=config.mirror.request_timeout_s,
        on_missing=reporter.missing,
        miss_wait_s=config.mirror.miss_wait_s if is_following(config) else 0.0,
        sock=sock,
    )


def is_wanted(config: Config) -> bool:
    """Whether the process has anything to serve (``serve-peers --check``): the node mirror
    runs in its own process (``serve-mirror``, decision 0063)."""
    return config.site.serve


def _tls_ready(config: Config, environ: Mapping[str, str]) -> bool:
    return all(path.is_file() for path in tls_files(config.site, environ))


async def _report_until(stop: asyncio.Event, reporter: Reporter, server: PeerServer) -> None:
    """Report to the daemon each ``REPORT_INTERVAL_S`` until ``stop``."""
    counted = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REPORT_INTERVAL_S):
                await stop.wait()
        served = server.counters.bytes_served
        reporter.flush(served - counted)
        counted = served


async def serve(config: Config, environ: Mapping[str, str] | None = None) -> int:
    """Serve the store to the site's peers until SIGTERM/SIGINT."""
    env = os.environ if environ is None else environ
    if not is_wanted(config):
        log.info("peer_server_off", config=str(config.source))
        return 0
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sender = ReportSender(report_socket_path(config))
    reporter = Reporter(sender)
    notifier = Notifier(env)
    try:
        if not await asyncio.to_thread(_tls_ready, config, env):
            # under the unit its conditions wait for the kubelet's files; by hand: said
            log.warning("peer_server_waiting_for_tls", cert=str(config.site.cert_file))
            return 1
        server = await asyncio.to_thread(build_server, config, env, reporter)
        async with server:
            notifier.ready("serving the store")
            await _report_until(stop, reporter, server)
            notifier.stopping("stopping")
    finally:
        sender.close()
    return 0
