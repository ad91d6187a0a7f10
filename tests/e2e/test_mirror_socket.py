"""The node mirror's socket unit under a real systemd (decision 0063), from the RPM.

``nodeagent-mirror.socket`` holds 127.0.0.1:22626 from boot, enabled by the package's preset;
the first connection starts ``nodeagent-mirror.service`` (``nodeagent serve-mirror``) as the
unprivileged ``nodeagent-peer`` user, with no capability and no credential. It does so on a
node WITHOUT the kubelet's serving certificate, where the peer unit stays skipped. While the
service is stopped, a local unprivileged user cannot bind the port (the attack:
tests/security/test_node_mirror_port_squatting.py makes it against systemd-socket-activate;
here against the package's own socket unit, which only a booted systemd runs). The daemon's
status says "ready" before the first request and "serving" after it.

The nodes of tests/e2e share this machine's network namespace: the session's node holds
127.0.0.1:22626 here while it runs, and a second node booted meanwhile (test_package.py)
finds the port taken (its socket unit fails; its tests do not ask for it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.testenv.node import Node
from tests.testenv.waiting import wait_for

SOCKET = "nodeagent-mirror.socket"
SERVICE = "nodeagent-mirror.service"
PEER = "nodeagent-peer.service"
KUBELET_FILES = ("var/lib/kubelet/pki/kubelet-server-current.pem", "etc/kubernetes/kubelet-ca.crt")

SQUAT = r"""
import errno, json, socket
out = {}
for name, option in (("plain", None), ("reuseaddr", socket.SO_REUSEADDR),
                     ("reuseport", socket.SO_REUSEPORT)):
    s = socket.socket()
    if option is not None:
        s.setsockopt(socket.SOL_SOCKET, option, 1)
    try:
        s.bind(("127.0.0.1", 22626))
        out[name] = "bound"
    except OSError as err:
        out[name] = errno.errorcode.get(err.errno, str(err.errno))
    s.close()
print(json.dumps(out))
"""

ASK = r"""
import http.client, json
conn = http.client.HTTPConnection("127.0.0.1", 22626, timeout=30)
conn.request("GET", "/v2/")
r = conn.getresponse(); r.read()
print(json.dumps([r.status, r.getheader("WWW-Authenticate")]))
"""


@pytest.fixture(scope="module")
def bare(node: Node) -> Iterator[Node]:
    """The node as booted: no kubelet serving certificate (the files are moved away while
    this module runs, if another module wrote them, and put back after)."""
    moved = []
    for name in KUBELET_FILES:
        path = node.root / name
        if path.exists():
            aside = path.with_name(path.name + ".e2e-aside")
            path.rename(aside)
            moved.append((aside, path))
    if moved:
        node.container.systemctl("stop", PEER)
    try:
        yield node
    finally:
        for aside, path in moved:
            aside.rename(path)


def mirror_state(node: Node) -> str:
    status = node.status() or {}
    return str((status.get("nodeMirror") or {}).get("state", ""))


def test_the_socket_holds_the_port_from_boot_without_the_service(bare: Node) -> None:
    socket = bare.show(SOCKET, "ActiveState", "SubState", "UnitFileState", "Listen")
    assert socket["ActiveState"] == "active" and socket["SubState"] == "listening", socket
    assert socket["UnitFileState"] == "enabled"  # the package's preset
    assert "127.0.0.1:22626" in socket["Listen"]
    bare.container.systemctl("stop", SERVICE)
    assert bare.show(SERVICE, "ActiveState")["ActiveState"] == "inactive"
    # /proc/net/tcp: 127.0.0.1:22626 (0100007F:5862) listening (0A), held by uid 0 (systemd)
    table = bare.container.run("cat", "/proc/net/tcp").stdout.splitlines()[1:]
    held = [line.split() for line in table if line.split()[1] == "0100007F:5862"]
    assert [(fields[3], fields[7]) for fields in held] == [("0A", "0")], held


def test_a_local_user_cannot_bind_the_port_while_the_service_is_stopped(bare: Node) -> None:
    bare.container.systemctl("stop", SERVICE)
    out = bare.container.run("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                             "python3", "-c", SQUAT).stdout  # fmt: skip
    assert json.loads(out) == {
        "plain": "EADDRINUSE", "reuseaddr": "EADDRINUSE", "reuseport": "EADDRINUSE"
    }  # fmt: skip
    assert bare.show(SERVICE, "ActiveState")["ActiveState"] == "inactive"  # binding starts none


def test_the_status_says_ready_before_the_first_request(bare: Node) -> None:
    bare.container.systemctl("stop", SERVICE)
    bare.container.systemctl("restart", "nodeagent.service")  # asks the socket at its start
    bare.wait_active("nodeagent.service", timeout_s=120)
    ready = "node mirror: ready on 127.0.0.1:22626, starts on the first request"
    # the status file of this run (the last run's may still say the same until it is written)
    wait_for(
        lambda: ready in bare.container.run("nodeagent", "status", check=False).stdout,
        timeout_s=120,
        interval_s=0.5,
        what="nodeagent status saying the node mirror is ready",
        detail=lambda: bare.container.run("nodeagent", "status", check=False).stdout,
    )
    assert mirror_state(bare) == "ready"
    assert bare.show(SERVICE, "ActiveState")["ActiveState"] == "inactive"  # asking started none


def test_a_connection_starts_the_mirror_unprivileged_without_the_kubelets_certificate(
    bare: Node,
) -> None:
    assert not any((bare.root / name).exists() for name in KUBELET_FILES)
    bare.container.systemctl("stop", SERVICE)
    status, challenge = json.loads(bare.container.run("python3", "-c", ASK).stdout)
    assert [status, challenge] == [401, 'Basic realm="nodeagent node mirror"']
    bare.wait_active(SERVICE)
    shown = bare.show(SERVICE, "MainPID", "TriggeredBy")
    assert SOCKET in shown["TriggeredBy"]
    credentials = bare.container.run("ls", f"/run/credentials/{SERVICE}", check=False)
    assert credentials.returncode != 0  # no credential: plain HTTP on loopback
    proc = bare.container.run("cat", f"/proc/{shown['MainPID']}/status").stdout
    fields = dict(line.split(":", 1) for line in proc.splitlines() if ":" in line)
    uid = bare.container.run("id", "-u", "nodeagent-peer").stdout.strip()
    assert set(fields["Uid"].split()) == {uid}
    for capability_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[capability_set], 16) == 0, capability_set
    assert "node_mirror_started" in bare.journal("-u", SERVICE)
    bare.wait_status(lambda s: mirror_state(bare) == "serving", what="nodeMirror.state serving")
    # the peer unit stays skipped without the certificate
    peer = bare.show(PEER, "ActiveState", "ConditionResult")
    assert peer["ActiveState"] in ("inactive", "failed") and peer["ConditionResult"] in ("no", "")


def test_security_exposure_of_the_mirror_unit(bare: Node) -> None:
    analysis = bare.container.run("systemd-analyze", "security", "--no-pager", SERVICE).stdout
    overall = re.search(rf"Overall exposure level for {SERVICE}: (\d+\.\d+) (\w+)", analysis)
    assert overall is not None, analysis[-2000:]
    assert float(overall.group(1)) <= 2.0, overall.group(0)


def test_with_the_mirror_off_a_connection_is_closed_and_the_port_stays_held(bare: Node) -> None:
    """``[mirror] enabled = false``: the service closes the waiting connections and exits;
    the socket goes on holding the port (nobody can squat it) until the administrator
    disables it. Connections again and again never make systemd give the socket up."""
    dropin = bare.root / "etc/nodeagent/config.d/50-no-mirror.toml"
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text("[mirror]\nenabled = false\n")
    try:
        bare.container.systemctl("stop", SERVICE)
        quick = ASK.replace("timeout=30", "timeout=10")
        for _ in range(6):  # more than the default start limit (5) would allow
            asked = bare.container.run("python3", "-c", quick, check=False)
            assert asked.returncode != 0  # closed without an answer
        wait_for(
            lambda: bare.show(SERVICE, "ActiveState")["ActiveState"] == "inactive",
            timeout_s=30,
            what="the mirror service gone again",
        )
        socket = bare.show(SOCKET, "ActiveState", "SubState")
        assert socket == {"ActiveState": "active", "SubState": "listening"}, socket
        assert bare.show(SERVICE, "Result")["Result"] == "success"
        assert "node_mirror_off" in bare.journal("-u", SERVICE)
        out = bare.container.run("setpriv", "--reuid=nobody", "--regid=nogroup",
                                 "--clear-groups", "python3", "-c", SQUAT).stdout  # fmt: skip
        assert json.loads(out)["reuseport"] == "EADDRINUSE"
    finally:
        dropin.unlink()
        bare.container.systemctl("reset-failed", SOCKET, SERVICE, check=False)
        bare.container.systemctl("restart", SOCKET, check=False)
