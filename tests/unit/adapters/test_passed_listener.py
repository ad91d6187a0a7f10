"""``adapters.systemd.passed_listener`` on real sockets: the descriptor systemd passes (3) is
taken only when it listens on exactly ``[mirror] listen`` (decision 0063). Each test puts a
socket at descriptor 3 in a child process, as systemd does before ``exec``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nodeagent.adapters.systemd import passed_listener
from nodeagent.config.addresses import parse_address

CHILD = r"""
import json, os, socket, sys
from nodeagent.adapters.systemd import passed_listener
from nodeagent.config.addresses import parse_address
from nodeagent.errors import ConfigInvalid
kind, wanted = sys.argv[1], parse_address(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0))
if kind == "listening":
    s.listen()
port = s.getsockname()[1]
fd = s.detach()
if fd != 3:
    os.dup2(fd, 3, inheritable=False)
    os.close(fd)
env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "1"}
if sys.argv[3] == "same":
    wanted = parse_address(f"127.0.0.1:{port}")
try:
    got = passed_listener(env, wanted)
except ConfigInvalid as err:
    print(json.dumps({"refused": err.message}))
else:
    assert got is not None
    print(json.dumps({"taken": got.getsockname()[1] == port, "blocking": got.getblocking()}))
"""


def run(kind: str, wanted: str, same: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, wanted, same],
        capture_output=True, text=True, check=True, timeout=30, pass_fds=(),
    )  # fmt: skip
    found: dict[str, object] = json.loads(done.stdout)
    return found


def test_the_socket_on_the_configured_address_is_taken() -> None:
    assert run("listening", "127.0.0.1:1", "same") == {"taken": True, "blocking": False}


@pytest.mark.parametrize(
    ("kind", "same", "said"),
    [
        ("listening", "other", "[mirror] listen is 127.0.0.1:1"),
        ("bound", "same", "the socket passed is not listening"),
        ("udp", "same", "the socket passed is not a TCP socket"),
    ],
)
def test_another_socket_is_refused_telling_the_admin_what_to_edit(
    kind: str, same: str, said: str
) -> None:
    refused = str(run(kind, "127.0.0.1:1", same)["refused"])
    assert said in refused
    assert "systemctl edit nodeagent-mirror.socket" in refused


def test_without_the_variables_nothing_is_passed() -> None:
    assert passed_listener({}, parse_address("127.0.0.1:22626")) is None
