"""Credentials from the auth file reach CRI-O (and never the log); sd_notify reaches systemd."""

from __future__ import annotations

import base64
import json
import socket
from pathlib import Path

from tests.conftest import Pushed
from tests.testenv.agent import Agent, set_state, set_status
from tests.testenv.crio import Crio
from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.registry import Registry
from tests.testenv.waiting import wait_for

USER, PASSWORD = "technician", "s3cret-pull-password"


async def test_private_registry_credentials_from_auth_file(
    registry: Registry, pushed: Pushed, tmp_path: Path
) -> None:
    with Registry(
        tmp_path / "private", htpasswd_users={USER: PASSWORD}, storage_root=registry.root
    ) as private:
        ref = pushed.base_a.reference(private.host)
        with Crio(tmp_path / "crio", insecure_registries=[private.host]) as crio:
            agent = Agent(tmp_path / "agent", crio)
            agent.write_config()
            agent.write_set("private", [ref])

            # Without credentials the registry refuses: a permanent failure with its reason.
            with agent:
                status = agent.wait_status(
                    lambda s: set_state(s, "private") == "Degraded", what="auth refusal"
                )
            item = set_status(status, "private")
            assert item is not None
            assert item["failedImages"][0]["reason"] == "RegistryAuthFailed"

            token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            agent.auth_file.write_text(json.dumps({"auths": {private.host: {"auth": token}}}))
            with agent:
                agent.wait_status(lambda s: set_state(s, "private") == "Pinned", what="pinned")
    log = agent.log_text()
    assert PASSWORD not in log
    assert token not in log


async def test_sd_notify_ready_status_and_clean_stop(
    crio: Crio, registry: Registry, pushed: Pushed, tmp_path: Path
) -> None:
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.setblocking(False)
    messages: list[str] = []

    def received(needle: str) -> bool:
        while True:
            try:
                messages.append(sock.recv(4096).decode())
            except BlockingIOError:
                break
        return any(needle in m for m in messages)

    agent = Agent(tmp_path / "agent", crio)
    agent.write_config()
    # An image of its own: the session's runtime has never stored it, so it is pulled.
    image = TestImage("nodeagent-test/notify", [LayerSpec(64 * 1024, seed=8101)]).build()
    agent.write_set("notify", [push(registry.url, image.repository, image).reference(pushed.host)])
    agent.extra_env = {"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "2000000"}
    agent.start()
    try:
        wait_for(lambda: received("READY=1"), timeout_s=60, what="READY=1")
        wait_for(lambda: received("STATUS=pinned 1/1 images"), timeout_s=60, what="STATUS line")
        # While the sync pulled, the line said so (then the pins, written last, followed).
        progress = [m for m in messages if "pulling 1" in m]
        assert progress, messages
        assert set(progress) == {"STATUS=pinned 0/1 images, pulling 1"}, messages
        assert messages.index(progress[0]) < messages.index("STATUS=pinned 1/1 images")
        wait_for(lambda: received("WATCHDOG=1"), timeout_s=10, what="watchdog ping")
        code = agent.stop()
        assert code == 0
        assert received("STOPPING=1")
    finally:
        if agent.process is not None:
            agent.kill()
        sock.close()
    assert "daemon_stopped" in agent.log_text()
