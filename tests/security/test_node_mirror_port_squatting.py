"""Attack: squat the node mirror's port while the mirror process is not running.

The node mirror's port (22626) is above 1024: any local user may bind it when nothing else
holds it. A squatter listening there would answer CRI-O's pulls; by digest the consumer
checks every byte, but a served tag (a ``tag-only`` mirror entry, ``--serve-tags``) would
take the squatter's manifest. Decision 0063: the port is held from boot by the socket unit
(``nodeagent-mirror.socket``), so no other process can bind it whether the mirror runs or
not, and the mirror process starts on the first connection with that socket.

Here the socket's holder is ``systemd-socket-activate``, which binds and passes the socket
by the same protocol and with the same kernel semantics as systemd's socket unit (a socket
bound without ``SO_REUSEPORT``); the mirror process it starts runs as the unprivileged peer
user in its own view of the files (``peer_process.agent_peer_command``), as its unit runs
it. tests/e2e/test_mirror_socket.py does the same against the package's units under a real
systemd. Seconds added: about 4.
"""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.testenv.peer_process import (
    OTHER_GID,
    OTHER_UID,
    PEER_GID,
    PEER_UID,
    agent_peer_command,
    as_peer,
)
from tests.testenv.registry import free_port
from tests.testenv.waiting import log_tail, wait_for

ROOT = Path(__file__).resolve().parents[2]

SQUAT = r"""
import errno, json, socket, sys
port = int(sys.argv[1])
out = {}
for name, option in (("plain", None), ("reuseaddr", socket.SO_REUSEADDR),
                     ("reuseport", socket.SO_REUSEPORT)):
    s = socket.socket()
    if option is not None:
        s.setsockopt(socket.SOL_SOCKET, option, 1)
    try:
        s.bind(("127.0.0.1", port))
        s.listen()
        out[name] = "bound"
    except OSError as err:
        out[name] = errno.errorcode.get(err.errno, str(err.errno))
    finally:
        s.close()
print(json.dumps(out))
"""


def squat(port: int) -> dict[str, str]:
    """Bind ``port`` as a local unprivileged user (not in the peer's group), three ways."""
    argv = [*as_peer(OTHER_UID, OTHER_GID), sys.executable, "-I", "-c", SQUAT, str(port)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    found: dict[str, str] = json.loads(done.stdout)
    return found


@dataclass
class Held:
    port: int
    holder: subprocess.Popen[bytes]
    log: Path

    def said(self) -> str:
        return self.log.read_text(errors="replace")


def write_config(base: Path, listen: str) -> Path:
    for directory in (base / "state" / "store", base / "run" / "peer"):
        directory.mkdir(parents=True)
    for directory in (base, base / "state", base / "run"):
        directory.chmod(0o755)
    shutil.chown(base / "state" / "store", group=PEER_GID)
    config = base / "config.toml"
    state = f'[state]\ndir = "{base}/state"\nrun_dir = "{base}/run"\n'
    config.write_text(f'{state}[mirror]\nlisten = "{listen}"\n')
    config.chmod(0o644)
    return config


def hold(base: Path, socket_port: int, mirror_port: int, *, enabled: bool = True) -> Held:
    """``systemd-socket-activate`` holding 127.0.0.1:``socket_port``, starting on the first
    connection ``nodeagent serve-mirror`` as the peer user, configured for ``mirror_port``."""
    config = write_config(base, f"127.0.0.1:{mirror_port}")
    if not enabled:
        config.write_text(config.read_text() + "enabled = false\n")
    log = base / "holder.log"
    mirror = [sys.executable, "-m", "nodeagent", "--config", str(config), "serve-mirror"]
    argv = [
        "systemd-socket-activate", f"--listen=127.0.0.1:{socket_port}",
        f"--setenv=PYTHONPATH={ROOT}",
        *agent_peer_command(base, base / "state", mirror),  # each step execs: one pid
    ]  # fmt: skip
    with log.open("wb") as out:
        holder = subprocess.Popen(argv, stdout=out, stderr=out, cwd="/")
    held = Held(socket_port, holder, log)
    wait_for(
        lambda: f"Listening on 127.0.0.1:{socket_port}" in held.said(),
        timeout_s=20,
        what="the socket to be held",
        detail=lambda: log_tail(log),
    )
    return held


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Held]:
    if shutil.which("systemd-socket-activate") is None:
        pytest.fail("systemd-socket-activate is missing (package systemd)")
    port = free_port()
    found = hold(tmp_path / "mirror", port, port)
    try:
        yield found
    finally:
        found.holder.terminate()
        found.holder.wait(timeout=30)


def v2(port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/v2/")
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("WWW-Authenticate") or ""
    finally:
        conn.close()


def test_a_local_user_cannot_bind_the_held_port_before_the_mirror_ever_ran(held: Held) -> None:
    assert "Execing" not in held.said()  # no mirror process yet: only the socket is held
    assert squat(held.port) == {
        "plain": "EADDRINUSE", "reuseaddr": "EADDRINUSE", "reuseport": "EADDRINUSE"
    }  # fmt: skip
    # the first connection starts the mirror on that socket, and it answers as the mirror
    status, challenge = v2(held.port)
    assert (status, challenge) == (401, 'Basic realm="nodeagent node mirror"')
    assert "node_mirror_started" in held.said()
    status_lines = Path(f"/proc/{held.holder.pid}/status").read_text().splitlines()
    uids = next(line.split()[1:] for line in status_lines if line.startswith("Uid:"))
    assert uids == [str(PEER_UID)] * 4  # the holder's pid became the unprivileged mirror
    assert squat(held.port)["reuseport"] == "EADDRINUSE"  # and while it runs


def test_without_a_holder_the_same_user_can_squat_the_port(tmp_path: Path) -> None:
    """What the socket unit prevents (the attack succeeds on a free port above 1024)."""
    assert squat(free_port()) == {"plain": "bound", "reuseaddr": "bound", "reuseport": "bound"}


def test_a_socket_on_another_address_is_refused_and_the_admin_told_what_to_edit(
    tmp_path: Path,
) -> None:
    mirror_port, socket_port = free_port(), free_port()
    held = hold(tmp_path / "mirror", socket_port, mirror_port)
    try:
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            v2(socket_port)  # the process refuses the socket and exits: no answer
        assert held.holder.wait(timeout=30) == 78
    finally:
        if held.holder.poll() is None:
            held.holder.kill()
            held.holder.wait()
    said = held.said()
    assert "node_mirror_socket_refused" in said
    assert f"listens on 127.0.0.1:{socket_port}, [mirror] listen is 127.0.0.1:{mirror_port}" in said
    assert "systemctl edit nodeagent-mirror.socket" in said


def test_with_the_mirror_off_the_waiting_connection_is_closed_not_left_to_retrigger(
    tmp_path: Path,
) -> None:
    """``[mirror] enabled = false``: the process closes what waits on the socket and exits 0.
    A connection left waiting would make systemd start the service again and again until it
    gives the socket up, releasing the port."""
    port = free_port()
    held = hold(tmp_path / "mirror", port, port, enabled=False)
    try:
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            v2(port)
        assert held.holder.wait(timeout=30) == 0
    finally:
        if held.holder.poll() is None:
            held.holder.kill()
            held.holder.wait()
    assert "node_mirror_off" in held.said() and "connections_closed=1" in held.said()
