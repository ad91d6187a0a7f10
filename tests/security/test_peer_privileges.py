"""Attack: take over the peer server (its HTTP and TLS parsers face the site network) and use
what the process holds. Decision 0056 moved it out of the root daemon.

One store-only site node (a network namespace, ``tests/testenv/site_node.py``) serves a
signed bundle: its daemon runs as root, its peer server as ``nodeagent-peer.service`` runs
it (``tests/testenv/peer_process.py``: another uid and gid, no capability, the state
directory hidden but for the store, read-only; the TLS files as credentials). Each test
plays a compromised peer server: code running with exactly the peer process's identity
and view.

- the process is not root and holds no capability (its /proc status);
- it cannot change the store: creating, writing, renaming or removing fails, by the
  permissions alone (``EACCES``, the store bound writable) and in the unit's view;
- it cannot make the daemon remove a sound blob: a forged ``corrupt`` report is checked
  by the daemon, which keeps the blob;
- a blob really damaged and then served is reported, checked and removed by the daemon;
- a flood of reports (distinct digests, garbage) makes the daemon hash at most its burst.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.site.reports import CHECK_BURST
from tests.integration.testenv.site_helpers import started_network
from tests.testenv.peer_process import PEER_GID, PEER_UID, VIEW, peer_command
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle
from tests.testenv.site_net import SiteHost
from tests.testenv.site_node import SiteNode
from tests.testenv.site_pki import issue_node_cert, make_ca, write_ca, write_pem_bundle
from tests.testenv.waiting import log_tail, wait_for

pytestmark = pytest.mark.integration

MIB = 1 << 20
BUNDLE_ID = "peer-privileges-1"
SOCKET = f"{VIEW}/root/run/nodeagent/peer/reports.sock"


@dataclass
class Site:
    node: SiteNode
    client: SiteHost
    bundle: Signed
    client_pem: Path
    ca_file: Path

    @property
    def store(self) -> Path:
        return self.node.state_dir / "store"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    base = tmp_path_factory.mktemp("peer-privileges")
    keys = Keys.make(base / "keys")
    images = [image("site/app", [(2 * MIB, 1), (1 * MIB, 2)], base / "layers")]
    bundle = signed_bundle(base / "stick", keys, images, bundle_id=BUNDLE_ID, set_name="s")
    ca = make_ca("site CA")
    with started_network(2) as net:
        server, client = net.hosts
        node = SiteNode(base / "node-0", server, name="node-0", ca=ca, serve_mirror=True)
        copy_bundle(node.state_dir / "store", bundle.root, bundle.manifest, keys.trusted_dir)
        pki = base / "client-pki"
        client_pem = write_pem_bundle(
            pki / "client.pem", issue_node_cert(ca, "node-1", [client.address])
        )
        ca_file = write_ca(pki / "ca.crt", ca)
        with node:
            node.wait_listening()
            node.wait_log("peer_reports_listening")
            yield Site(node, client, bundle, client_pem, ca_file)


def as_peer_process(site: Site, code: str, *, is_store_read_only: bool = True) -> object:
    """Run Python ``code`` as the peer server's process would (its uid, gid, view); the
    JSON it prints."""
    node = site.node
    argv = [node.python, "-c", code]
    view = peer_command(node.root, argv, is_store_read_only=is_store_read_only)
    command = [*node.exec_prefix, *view]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def stored_digests(site: Site) -> list[str]:
    return sorted(BlobStore(site.store).stored())


# ---------------------------------------------------------------- the process itself
def test_the_peer_process_is_not_root_and_holds_no_capability(site: Site) -> None:
    assert site.node.peer is not None
    status = Path(f"/proc/{site.node.peer.pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert "python" in fields["Name"]
    uids = {int(v) for v in fields["Uid"].split()}
    gids = {int(v) for v in fields["Gid"].split()}
    assert uids == {PEER_UID} and gids == {PEER_GID}
    assert fields["Groups"].strip() == ""
    for capability_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[capability_set], 16) == 0, capability_set
    assert fields["NoNewPrivs"].strip() == "1"


WRITE_ATTEMPTS = """
import errno, json, os, sys
store, blob = sys.argv[1], sys.argv[2]
tries = {
    "create": lambda: os.open(os.path.join(store, "planted"), os.O_WRONLY | os.O_CREAT, 0o644),
    "write": lambda: os.open(blob, os.O_WRONLY),
    "truncate": lambda: os.truncate(blob, 0),
    "remove": lambda: os.unlink(blob),
    "rename": lambda: os.rename(blob, blob + ".x"),
    "index": lambda: os.open(os.path.join(store, "index.json"), os.O_WRONLY | os.O_TRUNC),
    "chmod": lambda: os.chmod(blob, 0o666),
}
found = {}
for name, attempt in tries.items():
    try:
        attempt()
        found[name] = "done"
    except OSError as err:
        found[name] = errno.errorcode[err.errno]
print(json.dumps(found))
"""


@pytest.mark.parametrize("is_store_read_only", [False, True], ids=["permissions", "unit-view"])
def test_the_peer_process_cannot_change_the_store(site: Site, is_store_read_only: bool) -> None:
    digest = stored_digests(site)[0]
    store = f"{VIEW}/root/var/lib/nodeagent/store"
    blob = f"{store}/{BlobStore(site.store).path(digest).relative_to(site.store)}"
    code = WRITE_ATTEMPTS.replace("sys.argv[1], sys.argv[2]", f"{store!r}, {blob!r}")
    found = as_peer_process(site, code, is_store_read_only=is_store_read_only)
    assert isinstance(found, dict)
    chmod = found.pop("chmod")
    if is_store_read_only:  # the unit's view: read-only mount, and the permissions
        assert set(found.values()) <= {"EACCES", "EROFS"}, found
        assert chmod in ("EPERM", "EROFS")
    else:  # the permissions alone: the store is root's, its group may only read
        assert set(found.values()) == {"EACCES"}, found
        assert chmod == "EPERM"  # not the owner
    assert not (site.store / "planted").exists()
    assert digest in stored_digests(site)


# ---------------------------------------------------------------- reports
SEND = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sent = 0
for line in sys.stdin.buffer.read().split(b"\\n"):
    if line:
        try:
            sock.sendto(line, {socket!r})
            sent += 1
        except BlockingIOError:
            pass
print(json.dumps(sent))
"""


def send_reports(site: Site, datagrams: list[bytes]) -> int:
    node = site.node
    code = SEND.replace("{socket!r}", repr(SOCKET))
    command = [*node.exec_prefix, *peer_command(node.root, [node.python, "-c", code])]
    done = subprocess.run(
        command, input=b"\n".join(datagrams), capture_output=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout))


def largest_blob(site: Site) -> str:
    blobs = site.bundle.manifest.blobs
    return max(blobs, key=lambda d: blobs[d].size_bytes)


def test_a_forged_corrupt_report_does_not_remove_a_sound_blob(site: Site) -> None:
    digest = largest_blob(site)
    path = BlobStore(site.store).path(digest)
    before = path.read_bytes()
    assert send_reports(site, [f"corrupt {digest}".encode()]) == 1
    site.node.wait_log(f"peer_report_not_confirmed: digest={digest}", timeout_s=30)
    after = path.read_bytes()
    assert after == before
    assert "sha256:" + hashlib.sha256(after).hexdigest() == digest
    assert f"peer_report_confirmed: digest={digest}" not in site.node.current_run_log()


FETCH = """
import http.client, json, ssl, sys
context = ssl.create_default_context(cafile={ca!r})
context.load_cert_chain({pem!r})
conn = http.client.HTTPSConnection({host!r}, 9447, context=context, timeout=30)
conn.request("GET", {path!r})
response = conn.getresponse()
try:
    body = response.read()
    print(json.dumps({{"status": response.status, "bytes": len(body), "cut": False}}))
except (http.client.IncompleteRead, ConnectionError, ssl.SSLError) as err:
    print(json.dumps({{"status": response.status, "bytes": -1, "cut": True}}))
"""


def test_a_damaged_blob_served_is_reported_checked_and_removed_by_the_daemon(
    site: Site,
) -> None:
    blobs = site.bundle.manifest.blobs
    digest = min(blobs, key=lambda d: blobs[d].size_bytes)
    assert digest != largest_blob(site)  # not the one a forged report had checked
    path = BlobStore(site.store).path(digest)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the disk's damage: same size, other bytes
    path.write_bytes(bytes(data))
    code = FETCH.format(
        ca=str(site.ca_file),
        pem=str(site.client_pem),
        host=site.node.host.address,
        path=f"/v2/site/app/blobs/{digest}",
    )
    done = subprocess.run(
        [*site.client.exec_prefix, site.node.python, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["cut"] or answer["bytes"] != len(data), answer  # never sent whole
    site.node.wait_log(f"peer_report_confirmed: digest={digest}", timeout_s=30)
    wait_for(
        lambda: not path.exists(),
        timeout_s=10,
        what="the damaged blob removed",
        detail=lambda: log_tail(site.node.log_path),
    )


def test_a_flood_of_reports_costs_the_daemon_at_most_its_burst_of_checks(site: Site) -> None:
    before = site.node.current_run_log().count("peer_report_not_confirmed")
    forged = [f"corrupt sha256:{i:064x}".encode() for i in range(2000)]
    garbage = [b"corrupt ../../etc/shadow", b"served -1", b"x" * 4000, b"\xff\xfe"] * 50
    sent = send_reports(site, forged + garbage)
    assert sent >= 200  # most of them reached the daemon (the kernel queue may drop some)
    site.node.wait_log("peer_report_refused: reason=queue_full", timeout_s=30)
    site.node.wait_log("peer_report_refused: reason=malformed", timeout_s=30)
    checked = site.node.current_run_log().count("peer_report_not_confirmed") - before
    assert checked <= CHECK_BURST, checked
    site.node._check_running()  # the daemon (and the peer process) still run
