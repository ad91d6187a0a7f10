"""The failing front of the registry (tests/testenv/faulty.py) against the real registry."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator

import pytest

from tests.conftest import Pushed
from tests.testenv.faulty import Fault, RegistryFront
from tests.testenv.registry import Registry
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def front(registry: Registry) -> Iterator[RegistryFront]:
    with RegistryFront(registry.host) as running:
        yield running


def get(front: RegistryFront, path: str, agent: str = "test") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    try:
        conn.request("GET", path, headers={"User-Agent": agent})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def blob_path(pushed: Pushed) -> str:
    return f"/v2/{pushed.base_a.repository}/blobs/{pushed.base_a.layer_digests[0]}"


def test_pass_forwards_the_registry_s_answers(front: RegistryFront, pushed: Pushed) -> None:
    status, body = get(front, blob_path(pushed))
    assert status == 200
    assert len(body) > 100_000
    assert front.counters.blob_bytes == len(body)
    assert get(front, "/v2/nodeagent-test/none/manifests/sha256:" + "0" * 64)[0] == 404


def test_status_fault_answers_every_request_or_only_some(
    front: RegistryFront, pushed: Pushed
) -> None:
    front.set_fault(Fault.STATUS, status=503)
    assert get(front, "/v2/")[0] == 503
    front.set_fault(Fault.STATUS, status=500, only="/blobs/")
    assert get(front, "/v2/")[0] == 200
    assert get(front, blob_path(pushed))[0] == 500
    front.set_fault(Fault.STATUS, status=500, agent="nodeagent")
    assert get(front, "/v2/", agent="cri-o/1.34.0")[0] == 200
    assert get(front, "/v2/", agent="nodeagent/0.1")[0] == 500


def test_down_refuses_and_up_listens_again_on_the_same_port(front: RegistryFront) -> None:
    front.set_fault(Fault.DOWN)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", front.port), timeout=5).close()
    front.set_fault(Fault.PASS)
    assert get(front, "/v2/")[0] == 200


def test_reset_resets_before_any_answer(front: RegistryFront) -> None:
    front.set_fault(Fault.RESET)
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
        get(front, "/v2/")


def test_stall_holds_a_blob_after_some_bytes_until_released(
    front: RegistryFront, pushed: Pushed
) -> None:
    front.set_fault(Fault.STALL, stall_after_bytes=1000)
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=2)
    conn.request("GET", blob_path(pushed))
    response = conn.getresponse()
    assert response.status == 200
    assert len(response.read(1000)) == 1000
    with pytest.raises(TimeoutError):
        response.read(1)  # nothing more comes: the transfer is stalled
    assert front.counters.stalled == 1
    front.set_fault(Fault.PASS)  # released: the held connection ends
    wait_for(lambda: front.counters.stalled == 1, timeout_s=5, what="stall counted")
    conn.close()
