"""``nodeagent serve-mirror``: the node mirror in a process of its own (decision 0063).

systemd holds ``[mirror] listen`` from boot (``nodeagent-mirror.socket``, so no other local
process can bind the port) and starts ``nodeagent-mirror.service`` on the first connection:
the unprivileged ``nodeagent-peer`` user, no capability, no credential (the mirror is plain
HTTP on loopback), the store read-only. Until then the mirror costs no memory. It takes the
socket systemd passed (``adapters.systemd.passed_listener``: exactly ``[mirror] listen``,
else it exits 78 saying what to change), or binds the address itself when run by hand.

It serves until SIGTERM (``READY=1`` once it listens) and reports to the daemon over
``/run/nodeagent/peer/reports.sock`` as the peer process does (``daemon.site.Reporter``):
its state each ``REPORT_INTERVAL_S``, and each digest asked for that the store lacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Mapping
from typing import Final

import structlog

from nodeagent.adapters.http.node_mirror import NodeMirror
from nodeagent.adapters.peer_reports import ReportSender
from nodeagent.adapters.systemd import Notifier, passed_listener
from nodeagent.config import Config
from nodeagent.config.addresses import parse_address
from nodeagent.daemon.peer_reports import report_socket_path
from nodeagent.daemon.site import REPORT_INTERVAL_S, Reporter, build_mirror
from nodeagent.errors import ConfigInvalid

log = structlog.get_logger(__name__)


async def _report_until(stop: asyncio.Event, reporter: Reporter, mirror: NodeMirror) -> None:
    """The mirror's state to the daemon at once, then each ``REPORT_INTERVAL_S``."""
    reporter.mirror(mirror.report(serving=True))
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REPORT_INTERVAL_S):
                await stop.wait()
        reporter.mirror(mirror.report(serving=True))


MAX_DRAINED: Final = 1024
"""Connections closed at most when the mirror is off (the socket's backlog is 256)."""


def drain(sock: socket.socket) -> int:
    """Close the connections waiting on ``sock`` (non-blocking): with the mirror off, so that
    systemd does not start the service again at once for them, and keeps the port held."""
    closed = 0
    while closed < MAX_DRAINED:
        try:
            conn, _peer = sock.accept()
        except OSError:  # BlockingIOError: none waits any more
            break
        conn.close()
        closed += 1
    return closed


async def serve_mirror(config: Config, environ: Mapping[str, str] | None = None) -> int:
    """Serve the node mirror until SIGTERM/SIGINT; 0 at once when ``[mirror] enabled`` is
    off (the connections waiting on systemd's socket closed)."""
    env = os.environ if environ is None else environ
    wanted = parse_address(config.mirror.listen)  # a loopback address, checked at load
    try:
        sock = passed_listener(env, wanted)
    except ConfigInvalid as err:  # exits 78: not restarted (RestartPreventExitStatus=78)
        log.error("node_mirror_socket_refused", listen=str(wanted), error=err.message)
        raise
    if not config.mirror.enabled:
        closed = 0 if sock is None else drain(sock)
        log.info("node_mirror_off", config=str(config.source), connections_closed=closed)
        if sock is not None:
            sock.close()  # this process's copy: systemd keeps its own, and the port
        # Type=notify: an exit before READY=1 is a failure ("protocol"), which the unit's
        # Restart= would start again every RestartSec=; this is a clean stop.
        Notifier(env).ready("the node mirror is off ([mirror] enabled = false)")
        return 0
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sender = ReportSender(report_socket_path(config))
    reporter = Reporter(sender)
    mirror = build_mirror(config, reporter, sock=sock)
    reporter.mirror_state = lambda: mirror.report(serving=True)
    notifier = Notifier(env)
    try:
        try:
            await mirror.start()
        except OSError as err:
            log.error("node_mirror_not_started", listen=config.mirror.listen, error=str(err))
            return 1
        try:
            notifier.ready("serving the node mirror")
            await _report_until(stop, reporter, mirror)
            notifier.stopping("stopping")
        finally:
            await mirror.close()
        reporter.mirror(mirror.report(serving=False))
    finally:
        sender.close()
    return 0
