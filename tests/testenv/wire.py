"""A delay line between two TUN devices: the cable of an emulated network link.

``python -m tests.testenv.wire HOST_TUN NETNS NETNS_TUN DELAY_MS`` creates the TUN
device ``HOST_TUN`` in its own network namespace and ``NETNS_TUN`` inside the
named namespace (``/run/netns/NETNS``), then copies every packet from one to
the other after ``DELAY_MS`` milliseconds, in order, in both directions. The
devices are not persistent: they vanish with this process, however it ends.
Addresses, routes and qdiscs are the caller's business (``link.py``).

Why not ``tc netem``: this machine's kernel is built without ``sch_netem``
(``CONFIG_NET_SCH_NETEM`` is not set; ``tbf`` and ``htb`` are), so the delay is
added here and the rate limit, if any, by ``tbf`` on the TUN devices. Both
ends use the kernel's TCP/IP stack, so TCP sees a real round trip: handshakes,
slow start and ACK clocking all happen over the delayed path.

The devices carry ``IFF_VNET_HDR`` with TSO/checksum offload enabled: the
kernel hands over TCP segments of up to 64 KiB (with MSS-sized ``gso_size``
from a 1500-byte MTU) and the peer stack receives them as such, so the copy
costs a few thousand system calls per 300 MiB instead of a quarter million,
while TCP still counts its window in 1448-byte segments.

Prints ``ready`` on stdout once both devices are attached; SIGTERM stops it.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import select
import signal
import struct
import sys
import time
from collections import deque

TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUN_F_CSUM = 0x01
TUN_F_TSO4 = 0x02
TUN_F_TSO6 = 0x04
CLONE_NEWNET = 0x40000000
MAX_PACKET = 65536 + 64  # 64 KiB GSO packet plus the virtio-net header
READS_PER_WAKEUP = 64


def attach(name: str) -> int:
    """A new TUN device ``name`` in the current namespace: its fd, non-blocking, with offloads."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    request = struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI | IFF_VNET_HDR)
    fcntl.ioctl(fd, TUNSETIFF, request)
    fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
    return fd


def enter_netns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    ns_fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(ns_fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {name}: {os.strerror(errno)}")
    finally:
        os.close(ns_fd)


def drain(fd: int, queue: deque[tuple[float, bytes]], due: float) -> None:
    for _ in range(READS_PER_WAKEUP):
        try:
            queue.append((due, os.read(fd, MAX_PACKET)))
        except BlockingIOError:
            return


def deliver(fd: int, queue: deque[tuple[float, bytes]], now: float) -> None:
    while queue and queue[0][0] <= now:
        packet = queue.popleft()[1]
        try:
            os.write(fd, packet)
        except BlockingIOError:
            continue  # the peer's queue is full: the packet is lost, as on a real link
        except OSError as exc:
            if exc.errno not in (5, 22):  # EIO/EINVAL: device down or a packet it refuses
                raise


def run(host_fd: int, ns_fd: int, delay_s: float) -> None:
    to_ns: deque[tuple[float, bytes]] = deque()
    to_host: deque[tuple[float, bytes]] = deque()
    poller = select.poll()
    poller.register(host_fd, select.POLLIN)
    poller.register(ns_fd, select.POLLIN)
    while True:
        now = time.monotonic()
        pending = [q[0][0] for q in (to_ns, to_host) if q]
        timeout_ms = max(0.0, (min(pending) - now) * 1000) if pending else None
        events = poller.poll(None if timeout_ms is None else max(timeout_ms, 0.05))
        now = time.monotonic()
        for fd, _mask in events:
            if fd == host_fd:
                drain(host_fd, to_ns, now + delay_s)
            else:
                drain(ns_fd, to_host, now + delay_s)
        deliver(ns_fd, to_ns, now)
        deliver(host_fd, to_host, now)


def main(argv: list[str]) -> int:
    host_tun, netns, ns_tun, delay_ms = argv
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    host_fd = attach(host_tun)
    enter_netns(netns)
    ns_fd = attach(ns_tun)
    print("ready", flush=True)
    run(host_fd, ns_fd, float(delay_ms) / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
