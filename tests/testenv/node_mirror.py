"""A node store holding one signed bundle and one registry set, and the node mirror over it.

The images are named after registries that do not exist (``signed_bundles.HOST``,
``SET_HOST``): a pull that succeeds came from the node mirror. The registry set is made as
the store makes one (its blobs stored, a ``sets/<name>/record.json`` with source
"registry"), from a second bundle copied into a scratch store.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nodeagent.adapters.http.admission import Caps
from nodeagent.adapters.http.node_mirror import NodeMirror
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.adapters.store.records import StoreRecords
from nodeagent.mirror.credentials import MIRROR_USER, render_verifiers, verifier_of
from nodeagent.store import layout
from tests.testenv.signed_bundles import Keys, image, signed_bundle

MIB = 1 << 20
SET_HOST = "catalog.example:5000"
SET_NAME = "catalog"
PASSWORD = "node-mirror-test-s3cret"
CHUNK_BYTES = 64 * 1024
"""Small steps, so the test layers take the multi-chunk path."""


@dataclass(frozen=True)
class HeldStore:
    root: Path
    bundle_refs: tuple[str, ...]
    """``host/repo@digest`` of the bundle's images (any local client may pull them)."""
    set_refs: tuple[str, ...]
    """The registry set's images (only with the credential)."""
    set_blobs: tuple[str, ...]
    """Digests only the registry set holds."""
    verifiers: Path
    auth_file: Path
    """A root-only auth file holding the mirror's credential for ``127.0.0.1:<port>``
    (written by ``write_auth``)."""

    def write_auth(self, mirror_host: str) -> None:
        token = base64.b64encode(f"{MIRROR_USER}:{PASSWORD}".encode()).decode()
        self.auth_file.write_text(json.dumps({"auths": {mirror_host: {"auth": token}}}))
        self.auth_file.chmod(0o600)


def held_store(tmp_path: Path) -> HeldStore:
    keys = Keys.make(tmp_path / "keys")
    cache = tmp_path / "layers"
    app = image("example/app", [(MIB, 1), (MIB // 2, 2)], cache)
    tools = image("example/tools", [(MIB, 1), (MIB // 4, 3)], cache)
    bundle = signed_bundle(tmp_path / "stick", keys, [app, tools], bundle_id="b-1", set_name="s")
    store = tmp_path / "store"
    copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    # the registry set: copied into a scratch store, then its blobs and record moved over
    operator = image("vendor/operator", [(MIB // 2, 9)], cache)
    other = signed_bundle(
        tmp_path / "set", keys, [operator], bundle_id="set-src", set_name="x", host=SET_HOST
    )
    scratch = tmp_path / "scratch"
    copy_bundle(scratch, other.root, other.manifest, keys.trusted_dir)
    (record,) = StoreRecords(scratch).load(is_repairing=False).records
    held = set(bundle.manifest.blobs)
    for digest in other.manifest.blobs:
        target = store / layout.blob_path(digest)
        if not target.exists():
            shutil.copy2(scratch / layout.blob_path(digest), target)
    StoreRecords(store).write_set(
        layout.registry_record(SET_NAME, record.images, record.blobs, record.created, 1.0)
    )
    verifiers = tmp_path / "verifiers"
    verifiers.write_bytes(render_verifiers([verifier_of(MIRROR_USER, PASSWORD)]))
    return HeldStore(
        store,
        tuple(str(i.ref) for i in bundle.manifest.images),
        tuple(str(i.ref) for i in other.manifest.images),
        tuple(d for d in other.manifest.blobs if d not in held),
        verifiers,
        tmp_path / "mirror-auth.json",
    )


def node_mirror(
    held: HeldStore,
    *,
    port: int = 0,
    max_connections: int = 64,
    on_missing: Callable[[str], None] | None = None,
) -> NodeMirror:
    return NodeMirror(
        held.root,
        host="127.0.0.1",
        port=port,
        verifiers_file=held.verifiers,
        caps=Caps(max_connections, max_connections),
        request_timeout_s=20.0,
        chunk_bytes=CHUNK_BYTES,
        on_missing=on_missing,
    )
