"""Attack surface: the names the node mirror's drop-in is rendered from.

The drop-in (decision 0058) lists the repositories of the store's ``index.json``. A name
there comes from a verified bundle's signed manifest or from a PinnedImageSet a registry set
was pulled for; a crafted one (a signed but hostile bundle, a set written by anyone allowed
to write sets) could try to rewrite the node's registries.conf: close a TOML string and add
``blocked = false`` or a mirror of its own for another repository, point a prefix at a whole
registry (``quay.io``), carry a URI scheme, or be large enough to stall the render.

Here the real renderer and writer (``render-mirror-dropin --write``) run over an index that
holds one genuine image and such names. The drop-in names the genuine repository only, reads
back under containers/image's rules with the existing ``blocked`` kept, and the crafted
names are counted, never written; an index larger than the bound is refused unread and the
last good drop-in stays.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from nodeagent.registries import read_registries_conf
from nodeagent.store import layout
from nodeagent.store.layout import StoredImage

DIGEST = "sha256:" + "b" * 64
GOOD = f"quay.io/org/app@{DIGEST}"
CRAFTED = [
    f'quay.io/org/x"\nblocked = false\n[[registry.mirror]]\nlocation = "evil.example@{DIGEST}',
    f"quay.io@{DIGEST}",  # a whole registry as a prefix
    f"http://quay.io/org/y@{DIGEST}",
    f"quay.io/ORG/upper@{DIGEST}",
    f"quay.io/org/../other@{DIGEST}",
    "quay.io/org/app:latest",  # a tag: never mirrored by this file
    "quay.io/" + "a/" * 20000 + f"z@{DIGEST}",
]


def config(tmp_path: Path) -> Path:
    etc = tmp_path / "etc" / "containers"
    (etc / "registries.conf.d").mkdir(parents=True)
    (etc / "registries.conf").write_text(
        '[[registry]]\nlocation = "quay.io/org"\nblocked = true\n'
        '[[registry.mirror]]\nlocation = "mirror.site/org"\n'
    )
    conf = tmp_path / "config.toml"
    conf.write_text(
        f'[runtime]\nregistries_conf = "{etc / "registries.conf"}"\n'
        f'registries_dir = "{etc / "registries.conf.d"}"\n'
        f'[state]\ndir = "{tmp_path / "state"}"\nrun_dir = "{tmp_path / "run"}"\n'
    )
    return conf


def render(conf: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodeagent", "--config", str(conf), "--json",
         "render-mirror-dropin", "--write"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_crafted_names_never_reach_the_drop_in(tmp_path: Path) -> None:
    conf = config(tmp_path)
    store = tmp_path / "state" / "store"
    store.mkdir(parents=True)
    images = [StoredImage(n, DIGEST, 1, layout.INDEX_MEDIA_TYPE) for n in [GOOD, *CRAFTED]]
    (store / layout.INDEX_NAME).write_bytes(layout.render_index(images))
    started = time.monotonic()
    done = render(conf)
    elapsed_s = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["action"], doc["repositories"]) == ("wrote", 1)
    assert doc["blockedSources"] == ["quay.io/org/app"]
    dropin = tmp_path / "etc/containers/registries.conf.d/98-nodeagent-node-mirror.conf"
    text = dropin.read_text()
    assert "evil.example" not in text and "blocked = false" not in text
    read = read_registries_conf(
        [("registries.conf", (tmp_path / "etc/containers/registries.conf").read_text()),
         (dropin.name, text)]
    )  # fmt: skip
    ours = [e for e in read.entries if "127.0.0.1:22626" in str(e.mirrors)]
    assert [(e.prefix, e.is_blocked) for e in ours] == [("quay.io/org/app", True)]
    print(f"render with {len(CRAFTED)} crafted names: {elapsed_s:.2f} s (process start included)")
    assert elapsed_s < 10


def test_an_oversized_index_is_refused_and_the_last_drop_in_kept(tmp_path: Path) -> None:
    conf = config(tmp_path)
    store = tmp_path / "state" / "store"
    store.mkdir(parents=True)
    good = [StoredImage(GOOD, DIGEST, 1, layout.INDEX_MEDIA_TYPE)]
    (store / layout.INDEX_NAME).write_bytes(layout.render_index(good))
    assert render(conf).returncode == 0
    dropin = tmp_path / "etc/containers/registries.conf.d/98-nodeagent-node-mirror.conf"
    before = dropin.read_bytes()
    with (store / layout.INDEX_NAME).open("wb") as f:
        f.truncate(layout.MAX_INDEX_BYTES + 1)
    done = render(conf)
    assert done.returncode != 0
    assert "HostFileError" in done.stderr and "more than" in done.stderr
    assert dropin.read_bytes() == before
