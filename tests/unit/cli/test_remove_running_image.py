"""``bundle remove`` never removes the bundle holding the nodeagent image this node runs
(the set ``nodeagent-self`` keeps it, decision 0074): a real store filled by the copier, the
running image named as the container unit names it (``NODEAGENT_IMAGE``); removed once the
node runs another image."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nodeagent.adapters.bundles.agent_image import REPOSITORY, RUNNING_ENV
from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import copy_bundle
from tests.testenv.signed_bundles import Keys, image, signed_bundle


def remove(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodeagent", "bundle", "remove", "agent-1", "--root", str(root)],
        capture_output=True, text=True, check=False, cwd=root, env=env,
    )  # fmt: skip


def test_the_bundle_of_the_running_image_is_refused_another_is_removed(tmp_path: Path) -> None:
    keys = Keys.make(tmp_path / "keys")
    built = image("nodeagent", [(4096, 71)], tmp_path / "cache")
    signed = signed_bundle(tmp_path / "stick", keys, [built], bundle_id="agent-1", set_name="agent")
    store = tmp_path / "var/lib/nodeagent/store"
    copy_bundle(store, signed.root, signed.manifest, keys.trusted_dir)
    digest = signed.manifest.images[0].manifest_digest
    env = dict(os.environ)  # the interpreter's own nodeagent (the RPM's %check: the installed)

    refused = remove(tmp_path, env | {RUNNING_ENV: f"{REPOSITORY}@{digest}"})
    assert refused.returncode == 65, refused.stderr
    [line] = [x for x in refused.stderr.splitlines() if x.startswith("error: ")]
    assert line.startswith("error: LifecycleRefused: bundle agent-1 holds the nodeagent image")
    assert BlobStore(store).stored()  # nothing removed

    other = f"{REPOSITORY}@sha256:{'e' * 64}"
    removed = remove(tmp_path, env | {RUNNING_ENV: other})
    assert removed.returncode == 0, removed.stderr
    assert not BlobStore(store).stored()
