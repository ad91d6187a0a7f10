"""The peer server's process as systemd/nodeagent-peer.service runs it, for one test node
(and the node mirror's, ``nodeagent serve-mirror``, as systemd/nodeagent-mirror.service runs
it: the same user and view, without the credentials).

The unit runs ``nodeagent serve-peers`` as the unprivileged ``nodeagent-peer`` user, with no
capabilities, in a mount namespace where nodeagent's state directory is an empty
read-only tmpfs holding only the store, bound read-only (``TemporaryFileSystem=``,
``BindReadOnlyPaths=``), and with its TLS files copied as credentials (``LoadCredential=``,
``$CREDENTIALS_DIRECTORY``). The tests do the same by hand, as root, inside the node's
network namespace (whose ``ip netns exec`` gives a private mount namespace):

1. a tmpfs over ``/mnt`` (this namespace only) and the node's root bound at ``/mnt/root``;
2. a read-only tmpfs over ``/mnt/root/var/lib/nodeagent``, the store bound read-only in it;
3. ``setpriv``: uid ``PEER_UID``, gid ``PEER_GID`` and no other group, every capability
   set emptied, ``no_new_privs``; the command runs with ``--root /mnt/root``.

No user or group is added to this machine: the ids are numbers no account uses. The
group's files are prepared as the package's tmpfiles entries make them
(``prepare_node``): the store ``2750 root:PEER_GID``, the report socket's directory
``<run>/peer`` the same, the state directory ``0750``.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

PEER_UID = 64_891
"""The peer server's uid in the tests (no account; the package's is ``nodeagent-peer``)."""
PEER_GID = 64_891
"""Its group: the store's group."""
OTHER_UID = 64_892
"""A local unprivileged user, not in the peer's group (the attack tests)."""
OTHER_GID = 64_892
VIEW = "/mnt"
"""Where the peer's view of the node is built, in its private mount namespace only."""
STATE_DIR = "var/lib/nodeagent"
STORE_DIR = f"{STATE_DIR}/store"
RUN_DIR = "run/nodeagent"
CREDENTIALS_DIR = "run/credentials/nodeagent-peer.service"
"""Where systemd would put the unit's credentials (under the node's root)."""
CREDENTIALS = {
    "peer-cert": "var/lib/kubelet/pki/kubelet-server-current.pem",
    "peer-key": "var/lib/kubelet/pki/kubelet-server-current.pem",
    "peer-ca": "etc/kubernetes/kubelet-ca.crt",
}
"""Credential name -> the node file it is copied from (the unit's ``LoadCredential=``)."""


def prepare_node(root: Path) -> None:
    """The directories as the package makes them (tmpfiles, ``StateDirectoryMode=``)."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # the peer's view binds it at /mnt/root: it must be traversable
    state = root / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o750)
    for shared in (root / STORE_DIR, root / RUN_DIR / "peer"):
        shared.mkdir(parents=True, exist_ok=True)
        os.chown(shared, 0, PEER_GID)
        shared.chmod(0o2750)
    (root / RUN_DIR).chmod(0o755)


def load_credentials(root: Path) -> Path:
    """Copy the TLS files as systemd's ``LoadCredential=`` does at each start: owned by the
    service's user, read-only. Returns the directory as the peer sees it."""
    directory = root / CREDENTIALS_DIR
    if directory.exists():
        directory.chmod(0o700)
        shutil.rmtree(directory)
    directory.mkdir(parents=True, mode=0o700)
    for name, source in CREDENTIALS.items():
        target = directory / name
        shutil.copyfile(root / source, target)
        os.chown(target, PEER_UID, PEER_GID)
        target.chmod(0o400)
    os.chown(directory, PEER_UID, PEER_GID)
    directory.chmod(0o500)
    return Path(VIEW) / "root" / CREDENTIALS_DIR


def view_script(root: Path, *, is_store_read_only: bool = True) -> str:
    """Shell run as root in the node's mount namespace before ``exec "$@"`` as the peer."""
    view = f"{VIEW}/root"
    store_mount = "mount --bind -o ro" if is_store_read_only else "mount --bind"
    steps = [
        "set -e",
        f"mount -t tmpfs -o mode=0755,nosuid,nodev nodeagent-peer-view {VIEW}",
        f"mkdir {view}",
        f"mount --rbind {shlex.quote(str(root))} {view}",
        f"mount -t tmpfs -o mode=0755,nosuid,nodev nodeagent-peer-state {view}/{STATE_DIR}",
        f"mkdir {view}/{STORE_DIR}",
        f"mount -o remount,ro,bind {view}/{STATE_DIR} 2>/dev/null || true",
        f"{store_mount} {shlex.quote(str(root / STORE_DIR))} {view}/{STORE_DIR}",
        'exec "$@"',
    ]
    return "; ".join(steps)


def as_peer(uid: int = PEER_UID, gid: int = PEER_GID) -> list[str]:
    """``setpriv`` to ``uid``/``gid``, no other group, no capability, no new privileges."""
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
    ]


def peer_command(
    root: Path,
    argv: list[str],
    *,
    uid: int = PEER_UID,
    gid: int = PEER_GID,
    is_store_read_only: bool = True,
) -> list[str]:
    """``argv`` run as the peer's unit runs (prefix it with the node's namespace)."""
    script = view_script(root, is_store_read_only=is_store_read_only)
    return ["sh", "-c", script, "sh", *as_peer(uid, gid), *argv]


def share_with_peer(directory: Path) -> None:
    """``directory`` as the package's tmpfiles entries make the store and the report
    socket's directory: ``2750 root:PEER_GID`` (what is written in it inherits the group)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chown(directory, 0, PEER_GID)
    directory.chmod(0o2750)


def _hidden_top(path: Path) -> Path:
    """The topmost ancestor of ``path`` that another user cannot traverse (pytest's
    ``/tmp/pytest-of-root`` is 0700): covered in the peer's namespace, ``path`` rebound
    below it."""
    tops = [p for p in reversed(path.parents) if p != Path("/") and not p.stat().st_mode & 0o001]
    if not tops:
        raise ValueError(f"{path}: every ancestor is traversable, nothing to cover")
    return tops[0]


def agent_peer_command(base: Path, state_dir: Path, argv: list[str]) -> list[str]:
    """``argv`` run as the peer's unit runs it, for a ``tests.testenv.agent.Agent`` laid
    out under ``base`` (its absolute paths kept): in a private mount namespace ``base`` is
    reachable at its own path through directories any user may traverse, ``state_dir`` is
    an empty read-only tmpfs but for its ``store``, bound read-only, then ``setpriv`` to
    ``PEER_UID``/``PEER_GID`` with no capability. Nothing outside the namespace changes."""
    top, store = _hidden_top(base), (state_dir / "store").relative_to(base)
    quoted = {
        k: shlex.quote(str(v)) for k, v in (("base", base), ("top", top), ("state", state_dir))
    }
    steps = [
        "set -e",
        "umask 022",  # the view's directories; the peer's own umask is set before exec
        f"mount -t tmpfs -o mode=0755,nosuid,nodev nodeagent-peer-view {VIEW}",
        f"mkdir {VIEW}/base",
        f"mount --rbind {quoted['base']} {VIEW}/base",
        f"mount -t tmpfs -o mode=0755,nosuid,nodev nodeagent-peer-top {quoted['top']}",
        f"mkdir -p {quoted['base']}",
        f"mount --rbind {VIEW}/base {quoted['base']}",
        f"mount -t tmpfs -o mode=0755,nosuid,nodev nodeagent-peer-state {quoted['state']}",
        f"mkdir {quoted['state']}/store",
        f"mount --bind -o ro {VIEW}/base/{shlex.quote(str(store))} {quoted['state']}/store",
        "umask 077",  # as systemd/nodeagent-peer.service
        'exec "$@"',
    ]
    script = "; ".join(steps)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            *as_peer(), *argv]  # fmt: skip
