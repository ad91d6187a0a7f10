"""The RPM's peer server unit under a real systemd (decision 0056): skipped without the
kubelet's serving certificate; with one and ``[site] serve = true``, running as the
``nodeagent-peer`` user with no capability, its TLS files as credentials, answering over
mutual TLS; the store and the state not readable by others."""

from __future__ import annotations

import json
import re

import pytest

from tests.testenv.node import Node
from tests.testenv.site_pki import issue_node_cert, make_ca, write_ca, write_pem_bundle
from tests.testenv.waiting import wait_for

UNIT = "nodeagent-peer.service"
SERVER_PEM = "var/lib/kubelet/pki/kubelet-server-current.pem"
CA_FILE = "etc/kubernetes/kubelet-ca.crt"
SITE_DROPIN = "etc/nodeagent/config.d/50-site.toml"


def mode_owner(node: Node, path: str) -> str:
    return node.container.run("stat", "-c", "%a %U %G", path).stdout.strip()


def test_the_package_makes_the_user_and_shares_only_the_store(node: Node) -> None:
    assert node.container.run("getent", "passwd", "nodeagent-peer").stdout
    assert mode_owner(node, "/var/lib/nodeagent") == "750 root root"
    assert mode_owner(node, "/var/lib/nodeagent/store") == "2750 root nodeagent-peer"
    assert mode_owner(node, "/run/nodeagent/peer") == "2750 root nodeagent-peer"
    unit = node.show("nodeagent.service", "UMask")
    assert unit["UMask"] == "0027"


def test_a_store_written_before_is_fixed_by_the_packages_tmpfiles(node: Node) -> None:
    """What %post runs at the upgrade (and every boot): an old store's world-readable files
    get the peer group and lose the bits for others."""
    old = "/var/lib/nodeagent/store/blobs/sha256"
    node.container.run("sh", "-c", f"umask 022; mkdir -p {old}/../old && echo x > {old}/../old/f")
    node.container.run("chmod", "0755", f"{old}/../old")
    node.container.run("chgrp", "-R", "root", f"{old}/../old")
    node.container.run("systemd-tmpfiles", "--create", "/usr/lib/tmpfiles.d/nodeagent.conf")
    assert mode_owner(node, f"{old}/../old") == "2750 root nodeagent-peer"
    assert mode_owner(node, f"{old}/../old/f") == "640 root nodeagent-peer"


def test_without_the_kubelets_certificate_the_peer_unit_is_skipped(node: Node) -> None:
    shown = node.show(UNIT, "ActiveState", "ConditionResult", "Result")
    assert shown["ActiveState"] in ("inactive", "failed") and shown["Result"] == "success"
    assert shown["ConditionResult"] in ("no", "")  # skipped, or never started


@pytest.fixture(scope="module")
def serving(node: Node) -> None:
    """[site] serve = true on loopback, and the kubelet's files as a kubelet leaves them."""
    ca = make_ca("e2e site CA")
    write_pem_bundle(node.root / SERVER_PEM, issue_node_cert(ca, "e2e-node", ["127.0.0.1"]))
    write_ca(node.root / CA_FILE, ca)
    write_pem_bundle(node.root / "root/client.pem", issue_node_cert(ca, "e2e-peer", []))
    dropin = node.root / SITE_DROPIN
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text('[site]\nserve = true\nlisten = "127.0.0.1:9447"\nfollow = "off"\n')
    node.container.systemctl("restart", "nodeagent.service")
    node.wait_active("nodeagent.service", UNIT, timeout_s=120)


def test_the_peer_unit_runs_unprivileged_with_its_credentials(node: Node, serving: None) -> None:
    shown = node.show(UNIT, "MainPID", "User", "LoadCredential")
    status = node.container.run("cat", f"/proc/{shown['MainPID']}/status").stdout
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    uid = node.container.run("id", "-u", "nodeagent-peer").stdout.strip()
    assert set(fields["Uid"].split()) == {uid}
    for capability_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[capability_set], 16) == 0, capability_set
    code = (
        "import http.client, json, ssl\n"
        f"c = ssl.create_default_context(cafile='/{CA_FILE}')\n"
        "c.check_hostname = False\n"
        "c.load_cert_chain('/root/client.pem')\n"
        "h = http.client.HTTPSConnection('127.0.0.1', 9447, context=c, timeout=10)\n"
        "h.request('GET', '/nodeagent/v1/holdings')\n"
        "r = h.getresponse(); print(json.dumps([r.status, json.loads(r.read())['node']]))\n"
    )
    answer = node.container.run("python3", "-c", code).stdout
    assert json.loads(answer)[0] == 200
    journal = node.journal("-u", UNIT)
    assert "peer_server_started" in journal


def test_a_rotated_certificate_restarts_the_peer_unit_with_the_new_one(
    node: Node, serving: None
) -> None:
    before = node.show(UNIT, "InvocationID")["InvocationID"]
    ca = make_ca("e2e site CA, rotated")
    # as the kubelet rotates: a new file, then the -current.pem link re-pointed at it
    rotated = node.root / "var/lib/kubelet/pki/kubelet-server-rotated.pem"
    write_pem_bundle(rotated, issue_node_cert(ca, "e2e-node", ["127.0.0.1"]))
    link = node.root / "var/lib/kubelet/pki/.current.tmp"
    link.symlink_to(rotated.name)
    link.rename(node.root / SERVER_PEM)

    def restarted() -> bool:
        shown = node.show(UNIT, "InvocationID", "ActiveState")
        return shown["InvocationID"] != before and shown["ActiveState"] == "active"

    wait_for(restarted, timeout_s=60, what="the peer unit restarted after the rotation")
    credential = node.container.run(
        "sh", "-c", f"cat /run/credentials/{UNIT}/peer-cert"
    ).stdout.encode()
    assert credential == rotated.read_bytes()


def test_security_exposure_of_the_peer_unit(node: Node) -> None:
    analysis = node.container.run("systemd-analyze", "security", "--no-pager", UNIT).stdout
    overall = re.search(rf"Overall exposure level for {UNIT}: (\d+\.\d+) (\w+)", analysis)
    assert overall is not None, analysis[-2000:]
    assert float(overall.group(1)) <= 2.0, overall.group(0)
