"""Bundle media from udev, natively in asyncio: pyudev's netlink monitor on the event loop.

``MediaWatcher`` subscribes to the events systemd-udevd broadcasts AFTER its
rules ran (source ``udev``: they carry blkid's ``ID_FS_*`` properties), filtered
in the kernel to subsystem ``block``. The socket is registered with
``loop.add_reader``: no thread, no polling. Every event goes through
``nodeagent.bundles.media.MediaTracker``, so each arrival and removal is yielded once::

    async with MediaWatcher("NODEAGENT*") as watcher:
        for event in watcher.existing():   # media plugged in before we started
            ...
        async for event in watcher:        # and everything after
            ...

The monitor starts listening before ``existing()`` enumerates, so nothing falls
between the two; what both see is reported once. If the kernel drops events
because the socket's buffer overflowed (ENOBUFS), the watcher discards what is
still queued (older than what it is about to read), enumerates again and
reports the difference (``resync_count`` counts these recoveries).

Needs a running systemd-udevd: without it the kernel's raw events are never
re-broadcast with filesystem properties, and the udev database is empty.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import pyudev
import structlog

from nodeagent.bundles.media import (
    DEFAULT_BUSES,
    DEFAULT_FS_TYPES,
    MediaEvent,
    MediaKind,
    MediaTracker,
)
from nodeagent.errors import MediaMountFailed
from nodeagent.errors import MediaWatchFailed as MediaWatchFailed

log = structlog.get_logger(__name__)

UDEV_CONTROL: Final = Path("/run/udev/control")
"""systemd-udevd's control socket: its presence says a udev daemon runs (or ran)."""


_LOG_EVENTS: Final = {MediaKind.ARRIVED: "media_arrived", MediaKind.REMOVED: "media_removed"}


class _Closed:
    """Queue sentinel: the watcher was closed."""


def _properties(device: Any) -> dict[str, str]:
    return {str(key): str(value) for key, value in device.properties.items()}


def filesystem_of(devnode: str) -> tuple[str, str]:
    """(``ID_FS_TYPE``, ``ID_FS_LABEL``) of a block device, from the udev database: what
    ``bundle import DEVICE`` mounts it as (``nodeagent.cli.bundle_medium``)."""
    try:
        device = pyudev.Devices.from_device_file(pyudev.Context(), devnode)
    except (pyudev.DeviceNotFoundError, OSError, ValueError) as err:
        raise MediaMountFailed(f"{devnode} is no block device udev knows: {err}") from err
    props = _properties(device)
    return props.get("ID_FS_TYPE", ""), props.get("ID_FS_LABEL", "")


class MediaWatcher:
    """Async iterator of ``MediaEvent``s for block devices carrying bundle media."""

    def __init__(
        self,
        label_pattern: str,
        *,
        fs_types: Collection[str] = DEFAULT_FS_TYPES,
        buses: Collection[str] = DEFAULT_BUSES,
        udev_control: Path = UDEV_CONTROL,
        receive_buffer_bytes: int | None = None,
    ) -> None:
        """``fs_types``, ``buses``: what a labelled medium must be to be mounted (others are
        reported ``REFUSED``); ``receive_buffer_bytes``: the socket's buffer; None keeps
        libudev's 128 MiB."""
        self._tracker = MediaTracker(label_pattern=label_pattern, fs_types=fs_types, buses=buses)
        self._label_pattern = label_pattern
        self._fs_types, self._buses = sorted(fs_types), sorted(buses)
        self._udev_control = udev_control
        self._queue: asyncio.Queue[MediaEvent | _Closed | MediaWatchFailed] = asyncio.Queue()
        self._context: Any = None
        self._monitor: Any = None
        self._socket: socket.socket | None = None  # a dup of the monitor's, for SO_ERROR
        self._loop: asyncio.AbstractEventLoop | None = None
        self._receive_buffer_bytes = receive_buffer_bytes
        self.resync_count = 0
        """How often events were lost and the watcher recovered by enumerating."""

    @property
    def present(self) -> Mapping[str, MediaEvent]:
        """Device node -> the bundle media it carries, as far as the watcher knows now."""
        return self._tracker.present

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Open the netlink monitor and start reading it on the running event loop."""
        if self._monitor is not None:
            return
        if not self._udev_control.exists():
            log.warning("udev_not_running", control=str(self._udev_control))
        try:
            self._context = pyudev.Context()
            monitor = pyudev.Monitor.from_netlink(self._context, source="udev")
            monitor.filter_by(subsystem="block")
            if self._receive_buffer_bytes is not None:
                monitor.set_receive_buffer_size(self._receive_buffer_bytes)
            monitor.start()
        except OSError as err:
            raise MediaWatchFailed(f"cannot listen to udev events: {err}") from err
        self._monitor = monitor
        self._socket = socket.fromfd(monitor.fileno(), socket.AF_NETLINK, socket.SOCK_RAW)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(monitor.fileno(), self._on_readable)
        log.info(
            "media_watch_started",
            label_pattern=self._label_pattern,
            fs_types=self._fs_types,
            buses=self._buses,
        )

    def close(self) -> None:
        """Stop reading; once the events already queued are taken, the iteration ends."""
        if self._stop_reading():
            self._queue.put_nowait(_Closed())

    def _stop_reading(self) -> bool:
        if self._monitor is None:
            return False
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._monitor.fileno())
        self._monitor = None  # libudev closes the socket when the last reference goes
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        return True

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -------------------------------------------------------------- events

    def existing(self) -> list[MediaEvent]:
        """Arrivals for bundle media present now that were not reported yet.

        Reads the udev database (blocking, but local and quick). Call it once after
        ``start()``; later live events about the same media are not repeated.
        """
        if self._context is None:
            raise RuntimeError("MediaWatcher.existing() before start()")
        return self._tracker.reconcile(self._enumerate())

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> MediaEvent:
        item = await self._queue.get()
        if isinstance(item, _Closed):
            self._queue.put_nowait(item)  # every later call ends too
            raise StopAsyncIteration
        if isinstance(item, MediaWatchFailed):
            raise item
        return item

    def _enumerate(self) -> Iterator[dict[str, str]]:
        for device in self._context.list_devices(subsystem="block"):
            yield _properties(device)

    def _on_readable(self) -> None:
        try:
            for props in self._received():
                self._publish(self._tracker.feed(props))
        except OSError as err:
            if err.errno != errno.ENOBUFS:
                self._fail(err)
                return
            self._resync()

    def _resync(self) -> None:
        """Events were lost: drop the stale rest, then compare with the udev database."""
        self.resync_count += 1
        log.warning("udev_events_lost", action="enumerating block devices again")
        try:
            self._discard_queued()
        except OSError as err:
            self._fail(err)
            return
        self._publish(self._tracker.reconcile(self._enumerate()))

    def _discard_queued(self) -> None:
        while self._monitor is not None:
            try:
                if self._next_device() is None:
                    return
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    raise

    def _received(self) -> Iterator[dict[str, str]]:
        """Every event queued on the socket now (never blocks)."""
        while self._monitor is not None:
            device = self._next_device()
            if device is None:
                return
            yield _properties(device)

    def _next_device(self) -> Any:
        """pyudev's next device, or None; a socket error as ``OSError`` with its errno.

        pyudev reports POLLERR as an OSError WITHOUT errno; the socket's pending
        error (SO_ERROR, cleared by reading it) says what happened: ENOBUFS when
        the kernel dropped events because the receive buffer was full.
        """
        try:
            return self._monitor.poll(timeout=0)
        except OSError as err:
            if err.errno is not None or self._socket is None:
                raise
            code = self._socket.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) or errno.EIO
            raise OSError(code, os.strerror(code)) from err

    def _publish(self, events: list[MediaEvent]) -> None:
        for event in events:
            if event.kind is MediaKind.REFUSED:  # the consumer logs it, once, as a warning
                self._queue.put_nowait(event)
                continue
            log.info(
                _LOG_EVENTS[event.kind],
                devnode=event.devnode,
                label=event.label,
                fs_type=event.fs_type,
                uuid=event.uuid,
                udev_action=event.action,
                seqnum=event.seqnum,
                udev_rule=event.is_rule_marked,
                bus=event.bus,
            )
            self._queue.put_nowait(event)

    def _fail(self, err: OSError) -> None:
        log.error("media_watch_failed", error=str(err))
        failure = MediaWatchFailed(f"reading udev events failed: {err}")
        failure.__cause__ = err
        if self._stop_reading():
            self._queue.put_nowait(failure)
            self._queue.put_nowait(_Closed())
