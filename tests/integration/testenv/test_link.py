"""The benchmark's emulated link: a registry in a private network namespace, a round trip away.

``tests/testenv/link.py`` puts a TUN pair between the host and a new network namespace
and delays every packet in the delay line (``wire.py``); a ``tbf`` qdisc limits the
rate. These tests hold it to what the benchmark's link profile claims: TCP sees the
configured round trip, the rate limit holds, the registry is reachable only through
the link, and nothing is left behind.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.link import EmulatedLink
from tests.testenv.registry import Registry

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
RTT_MS = 40.0
RATE_MBIT = 16.0


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, str]]:
    """A loopback registry holding one image with a 1 MiB layer; yields it and the layer."""
    with Registry(tmp_path_factory.mktemp("origin")) as registry:
        image = TestImage("link/probe", [LayerSpec(MIB, seed=7)]).build()
        push(registry.url, image.repository, image)
        yield registry, image.layers[0].digest


def far_registry(base: Path, origin: Registry, link: EmulatedLink) -> Registry:
    return Registry(
        base / "far",
        storage_root=origin.root,
        address=link.netns_address,
        command_prefix=link.exec_prefix,
    )


def ip_output(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def test_tcp_sees_the_round_trip_and_the_registry_answers_through_the_link(
    tmp_path: Path, origin: tuple[Registry, str]
) -> None:
    with (
        EmulatedLink(tmp_path / "link", rtt_ms=RTT_MS) as link,
        far_registry(tmp_path, origin[0], link) as far,
    ):
        started = time.monotonic()
        with socket.create_connection((link.netns_address, far.port), timeout=5):
            connect_s = time.monotonic() - started
        conn = http.client.HTTPConnection(link.netns_address, far.port, timeout=5)
        conn.connect()
        started = time.monotonic()
        conn.request("GET", "/v2/")
        response = conn.getresponse()
        response.read()
        request_s = time.monotonic() - started
        conn.close()
        assert response.status == 200
        # SYN -> SYN/ACK is one round trip; so is a request on an open connection.
        assert connect_s >= RTT_MS / 1000 * 0.95
        assert request_s >= RTT_MS / 1000 * 0.95
        # The registry listens inside the namespace only: not on the host's loopback.
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", far.port), timeout=1).close()


def test_rate_limit_holds_for_a_blob(tmp_path: Path, origin: tuple[Registry, str]) -> None:
    registry, layer_digest = origin
    with (
        EmulatedLink(tmp_path / "link", rtt_ms=2.0, rate_mbit=RATE_MBIT) as link,
        far_registry(tmp_path, registry, link) as far,
    ):
        conn = http.client.HTTPConnection(link.netns_address, far.port, timeout=30)
        started = time.monotonic()
        conn.request("GET", f"/v2/link/probe/blobs/{layer_digest}")
        response = conn.getresponse()
        size = len(response.read())
        elapsed_s = time.monotonic() - started
        conn.close()
    assert response.status == 200
    assert size > MIB // 2  # gzip of random bytes stays about as large
    # tbf lets one burst (256 KiB) through at once, the rest at the rate.
    floor_s = (size - 256 * 1024) * 8 / (RATE_MBIT * 1e6)
    assert elapsed_s >= floor_s * 0.9


def test_stopping_removes_the_namespace_and_both_devices(tmp_path: Path) -> None:
    link = EmulatedLink(tmp_path / "link", rtt_ms=10.0)
    with link:
        assert link.netns in ip_output("netns", "list")
        assert link.host_device in ip_output("-o", "link", "show")
    assert link.netns not in ip_output("netns", "list")
    assert link.host_device not in ip_output("-o", "link", "show")
    assert not Path(f"/run/netns/{link.netns}").exists()
