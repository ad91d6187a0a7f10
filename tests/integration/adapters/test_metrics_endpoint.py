"""The metrics endpoint (``adapters.metrics``) on a real loopback socket: it answers while the
event loop is busy (a scrape never waits on a sync), in the format the scraper asks for, and
a port already taken is ``MetricsListenFailed``."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest

from nodeagent.adapters.metrics import MetricsEndpoint
from nodeagent.errors import MetricsListenFailed
from nodeagent.metrics.recorder import Recorder
from nodeagent.metrics.series import Transfer

pytestmark = pytest.mark.integration


def get(port: int, accept: str) -> tuple[str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310  (loopback http)
        return answer.headers["Content-Type"], answer.read().decode()


async def test_a_scrape_is_answered_while_the_event_loop_is_held() -> None:
    recorder = Recorder()
    recorder.transferred(Transfer.PULLED, 1234)
    held = asyncio.Lock()  # as a sync holds its locks
    async with MetricsEndpoint(recorder, host="127.0.0.1", port=0) as endpoint, held:
        # Called on the loop's own thread, which is blocked until the answer comes: only a
        # server that needs neither the loop nor the sync's locks can answer.
        content_type, text = get(endpoint.bound_port, "text/plain")
    assert content_type.startswith("text/plain")
    assert 'nodeagent_transferred_bytes_total{kind="pulled"} 1234.0' in text


async def test_openmetrics_when_asked_for() -> None:
    async with MetricsEndpoint(Recorder(), host="127.0.0.1", port=0) as endpoint:
        content_type, text = await asyncio.to_thread(
            get, endpoint.bound_port, "application/openmetrics-text; version=1.0.0"
        )
    assert content_type.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")


async def test_a_taken_port_is_metrics_listen_failed_and_says_what_to_do() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsListenFailed) as raised:
            async with MetricsEndpoint(Recorder(), host="127.0.0.1", port=port):
                pass
    assert f"127.0.0.1:{port}" in raised.value.message
    assert "[metrics] listen" in raised.value.message
    assert raised.value.reason == "MetricsListenFailed"
