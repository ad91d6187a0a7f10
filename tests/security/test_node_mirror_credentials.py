"""Attack: a local unprivileged user reads registry-set content from the node mirror.

Issue 25, item 1. Registry-set blobs were pulled with the cluster's pull secret; the node
mirror listens on loopback, where any local process reaches it. Here a process running as
an unprivileged uid (``peer_process.OTHER_UID``: no account, no group of nodeagent's) asks the
real ``NodeMirror`` for every blob only the registry set holds, by digest, under the set's
repository and under a bundle's, with no credential, with wrong ones, with the verifier it
might have guessed, with malformed ones: each answer is a 404 with no content. It cannot
read the root-only auth file that holds the credential. Bundle content it does get (any
local client may). With the credential, the same request is served (the control). Last,
the same against the peer unit's own process (unprivileged, in a site node): a local user
cannot read the verifiers it checks against, and is challenged, until it shows the
credential.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.http.admission import Caps
from nodeagent.adapters.http.node_mirror import NodeMirror
from nodeagent.mirror.credentials import MIRROR_USER, render_verifiers, verifier_of
from nodeagent.references import parse_pinned_image_ref
from tests.security import test_peer_privileges as peer_privileges
from tests.security.test_peer_privileges import Site
from tests.testenv.node_mirror import PASSWORD, HeldStore, held_store, node_mirror
from tests.testenv.peer_process import OTHER_GID, OTHER_UID, PEER_GID, as_peer

CLIENT = r"""
import http.client, json, sys
port, asks = int(sys.argv[1]), json.loads(sys.stdin.read())
out = []
for method, path, headers in asks:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request(method, path, headers=headers)
    response = conn.getresponse()
    body = response.read()
    out.append([response.status, body.hex()])
    conn.close()
try:
    open(sys.argv[2], "rb").read()
    out.append("auth file read")
except PermissionError:
    out.append("auth file refused")
print(json.dumps(out))
"""


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


WRONG = [
    {},
    {"Authorization": basic(MIRROR_USER, "guess")},
    {"Authorization": basic("", "")},
    {"Authorization": basic(MIRROR_USER, verifier_of(MIRROR_USER, PASSWORD))},
    {"Authorization": "Basic !!!not-base64!!!"},
    {"Authorization": "Bearer " + PASSWORD},
    {"Authorization": "Basic " + base64.b64encode(PASSWORD.encode()).decode()},
    {"Authorization": basic(MIRROR_USER, PASSWORD + "x" * 2000)},
]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[HeldStore, NodeMirror]]:
    held = await asyncio.to_thread(held_store, tmp_path)
    async with node_mirror(held) as server:
        held.write_auth(f"127.0.0.1:{server.port}")
        yield held, server


def as_other_user(
    port: int, auth_file: Path, asks: list[tuple[str, str, dict[str, str]]]
) -> list[Any]:
    argv = [*as_peer(OTHER_UID, OTHER_GID), sys.executable, "-c", CLIENT, str(port), str(auth_file)]
    result = subprocess.run(
        argv, input=json.dumps(asks), capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    answers: list[Any] = json.loads(result.stdout)
    return answers


async def test_no_registry_set_blob_without_the_credential(
    served: tuple[HeldStore, NodeMirror],
) -> None:
    held, server = served
    set_repo = parse_pinned_image_ref(held.set_refs[0]).repository
    bundle_repo = parse_pinned_image_ref(held.bundle_refs[0]).repository
    manifest = parse_pinned_image_ref(held.set_refs[0]).digest
    asks = []
    for headers in WRONG:
        for repo in (set_repo, bundle_repo):
            for digest in held.set_blobs:
                asks.append(("GET", f"/v2/{repo}/blobs/{digest}", headers))
                asks.append(("HEAD", f"/v2/{repo}/blobs/{digest}", headers))
            asks.append(("GET", f"/v2/{repo}/manifests/{manifest}", headers))
    bundle_ref = parse_pinned_image_ref(held.bundle_refs[0])
    asks.append(("GET", f"/v2/{bundle_ref.repository}/manifests/{bundle_ref.digest}", {}))
    answers = await asyncio.to_thread(as_other_user, server.port, held.auth_file, asks)
    *denied, bundle_answer, auth_file = answers
    assert auth_file == "auth file refused"
    for digest_hex in (d.removeprefix("sha256:") for d in held.set_blobs):
        assert all(digest_hex not in body for _, body in denied)
    assert {status for status, _ in denied} == {404}
    assert bundle_answer[0] == 200  # bundle content: any local client
    assert server.counters.denied == len(denied)
    assert server.counters.served.blobs_served == 0


async def test_the_credential_is_what_opens_them(served: tuple[HeldStore, NodeMirror]) -> None:
    """The control: the same requests with the auth file's credential are served whole."""
    held, server = served
    repo = parse_pinned_image_ref(held.set_refs[0]).repository
    token = json.loads(held.auth_file.read_text())["auths"][f"127.0.0.1:{server.port}"]["auth"]
    headers = {"Authorization": f"Basic {token}"}
    asks = [("GET", f"/v2/{repo}/blobs/{d}", headers) for d in held.set_blobs]
    answers = (await asyncio.to_thread(as_other_user, server.port, held.auth_file, asks))[:-1]
    for digest, (status, body) in zip(held.set_blobs, answers, strict=True):
        assert status == 200
        assert "sha256:" + hashlib.sha256(bytes.fromhex(body)).hexdigest() == digest


async def test_a_credential_written_since_the_last_read_is_taken_at_once(
    tmp_path: Path,
) -> None:
    """The daemon writes the verifiers at its start and with each new credential; the
    server reads them with its offer, at most once a second (here once an hour). A good
    credential it does not know yet has the file looked at again (a ``stat``) and is taken
    at once; a wrong one is still refused, and reads nothing while the file is unchanged."""
    held = await asyncio.to_thread(held_store, tmp_path)
    good = held.verifiers.read_bytes()
    held.verifiers.write_bytes(render_verifiers([verifier_of(MIRROR_USER, "an older one")]))
    server = NodeMirror(
        held.root, host="127.0.0.1", port=0, verifiers_file=held.verifiers,
        caps=Caps(8, 8), request_timeout_s=20.0, offer_ttl_s=3600.0,
    )  # fmt: skip
    repo = parse_pinned_image_ref(held.set_refs[0]).repository
    path = f"/v2/{repo}/blobs/{held.set_blobs[0]}"
    credential = {"Authorization": basic(MIRROR_USER, PASSWORD)}

    def status(headers: dict[str, str]) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse().status
        conn.close()
        return answer

    async with server:
        assert await asyncio.to_thread(status, credential) == 404  # not the credential yet
        replace_atomically(held.verifiers, good)  # the daemon's new credential
        assert await asyncio.to_thread(status, credential) == 200
        assert await asyncio.to_thread(status, WRONG[1]) == 404


def replace_atomically(path: Path, data: bytes) -> None:
    """As the daemon writes it (``write_atomic``): a new file renamed over the old."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_bytes(data)
    fresh.rename(path)


# ------------------------------------------------------------ the unit's own process
# The peer server's process as systemd/nodeagent-peer.service runs it (unprivileged, the
# store read-only, in a site node's network namespace), over a store with a signed bundle.
site = peer_privileges.site

PROBE = r"""
import http.client, json, sys
out = {}
try:
    open(sys.argv[1], "rb").read()
    out["verifiers"] = "read"
except PermissionError:
    out["verifiers"] = "refused"
for name, path, header in json.loads(sys.argv[2]):
    conn = http.client.HTTPConnection("127.0.0.1", 22626, timeout=20)
    conn.request("GET", path, headers={"Authorization": header} if header else {})
    response = conn.getresponse()
    out[name] = [response.status, len(response.read())]
print(json.dumps(out))
"""


def in_node_as(site: Site, uid: int, gid: int, asks: list[tuple[str, str, str]]) -> dict[str, Any]:
    node = site.node
    verifiers = node.path("/run/nodeagent/peer/mirror-credentials")
    argv = [*node.exec_prefix, *as_peer(uid, gid), node.python, "-c", PROBE, str(verifiers)]
    done = subprocess.run(
        [*argv, json.dumps(asks)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_the_unprivileged_peer_process_serves_the_mirror_and_checks_the_credential(
    site: Site,
) -> None:
    node = site.node
    node.wait_log("node_mirror_started")
    auth = json.loads(node.path("/run/containers/0/auth.json").read_text())["auths"]
    token = auth["127.0.0.1:22626"]["auth"]
    verifiers = node.path("/run/nodeagent/peer/mirror-credentials")
    info = verifiers.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (0, PEER_GID, 0o640)
    layer = sorted(site.bundle.manifest.blobs)[0]
    asks = [
        ("base", "/v2/", ""),
        ("base_with_credential", "/v2/", f"Basic {token}"),
        ("bundle_blob", f"/v2/site/app/blobs/{layer}", ""),
    ]
    other = in_node_as(site, OTHER_UID, OTHER_GID, asks)
    assert other["verifiers"] == "refused"  # a local user cannot even read the verifiers
    assert other["base"][0] == 401  # no credential: challenged
    assert other["base_with_credential"][0] == 200  # the peer process read the verifiers
    assert other["bundle_blob"][0] == 200  # bundle content: any local client
