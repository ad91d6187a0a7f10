"""Attack: a local unprivileged user reads the node's image store and nodeagent's state:
registry-set blobs (pulled with the node's pull secret: images the user may not pull),
the sets' records, the status (decision 0056, finding 10 of issue 24).

A real daemon (``[store] registry_sets`` on, real CRI-O, the session's registry) pins a
set and writes its blobs into a real store, with the unit's ``UMask=0027`` and the
directories the package's tmpfiles entries make (the state directory ``0750``, the store
``2750 root:<peer group>``). Then, in a private mount namespace where the daemon's files
are bound at ``/mnt/root`` (so only nodeagent's own modes stand in the way, not the test's
temporary directories), a user that is not in the peer group opens each of them: every
open fails with ``EACCES``, also with the state directory bypassed (the store bound
alone). The peer group's user reads the same store (the control: the files exist and the
path is right).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Pushed
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.peer_process import OTHER_GID, OTHER_UID, PEER_GID, PEER_UID, as_peer

pytestmark = pytest.mark.integration

ON = "[store]\nregistry_sets = true\n"

OPEN_EACH = """
import errno, json, sys
found = {}
for path in json.loads(sys.argv[1]):
    try:
        with open(path, "rb") as stream:
            stream.read(1)
        found[path] = "read"
    except OSError as err:
        found[path] = errno.errorcode[err.errno]
print(json.dumps(found))
"""


def open_as(
    uid: int, gid: int, base: Path, paths: list[str], *, store_alone: bool
) -> dict[str, str]:
    """Open each of ``paths`` (relative to the agent's base) as ``uid:gid``, in a mount
    namespace where the base is bound at /mnt/root (or, ``store_alone``, only its store at
    /mnt/root/state/store under an open /mnt/root/state)."""
    source = base / "state/store" if store_alone else base
    target = "/mnt/root/state/store" if store_alone else "/mnt/root"
    script = "; ".join(
        [
            "set -e",
            "mount --make-rprivate /",
            "mount -t tmpfs -o mode=0755 nodeagent-test-view /mnt",
            f"mkdir -p {target}",
            f"mount --rbind {source} {target}",
            'exec "$@"',
        ]
    )
    argv = [
        "unshare",
        "--mount",
        "sh",
        "-c",
        script,
        "sh",
        *as_peer(uid, gid),
        sys.executable,
        "-c",
        OPEN_EACH,
        json.dumps([f"/mnt/root/{p}" for p in paths]),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    found: dict[str, str] = json.loads(done.stdout)
    return {k.removeprefix("/mnt/root/"): v for k, v in found.items()}


def prepare_like_the_package(agent: Agent) -> None:
    agent.base.mkdir(parents=True, exist_ok=True)
    agent.base.chmod(0o755)
    agent.state_dir.mkdir(mode=0o750, exist_ok=True)
    agent.state_dir.chmod(0o750)
    store = agent.state_dir / "store"
    store.mkdir(exist_ok=True)
    os.chown(store, 0, PEER_GID)
    store.chmod(0o2750)


@pytest.mark.timeout(240)
async def test_a_local_user_reads_no_registry_set_blob_record_or_state_file(
    pushed: Pushed, tmp_path: Path
) -> None:
    refs = [pushed.ref(pushed.base_a)]
    crio = Crio(tmp_path / "crio", insecure_registries=[pushed.host])
    with crio:
        agent = Agent(tmp_path / "agent", crio, extra_config=ON)
        agent.umask = 0o027  # as systemd/nodeagent.service
        prepare_like_the_package(agent)
        agent.write_config()
        agent.write_set("apps", refs)
        with agent:
            agent.wait_status(lambda s: set_state(s, "apps") == "Pinned", what="apps pinned")
            record = json.loads((agent.state_dir / "store/sets/apps/record.json").read_bytes())
            blobs = [b["digest"].removeprefix("sha256:") for b in record["blobs"]]
            assert blobs
            store_files = [
                "state/store/sets/apps/record.json",
                "state/store/index.json",
                *(f"state/store/blobs/sha256/{hex_}" for hex_ in blobs),
            ]
            state_files = ["state/status.json"]

            # modes: nothing of the state for others; the store's files the peer group's
            for path in sorted(agent.state_dir.rglob("*")):
                info = path.lstat()
                assert not info.st_mode & stat.S_IRWXO, f"{path}: {stat.filemode(info.st_mode)}"
                if path.is_relative_to(agent.state_dir / "store"):
                    assert info.st_gid == PEER_GID, path
                    assert not info.st_mode & stat.S_IWGRP, path

            other = open_as(
                OTHER_UID, OTHER_GID, agent.base, store_files + state_files, store_alone=False
            )
            assert set(other.values()) == {"EACCES"}, other
            other_store = open_as(OTHER_UID, OTHER_GID, agent.base, store_files, store_alone=True)
            assert set(other_store.values()) == {"EACCES"}, other_store
            peer = open_as(PEER_UID, PEER_GID, agent.base, store_files, store_alone=True)
            assert set(peer.values()) == {"read"}, peer
