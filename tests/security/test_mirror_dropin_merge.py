"""Attack surface: an import must not undo the node's registries.conf for the bundle's images.

Issue 24, finding 9. During an import the loopback mirror's drop-in gives each bundle
repository a ``[[registry]]`` entry of its own. A later drop-in's entry replaces an earlier
one with the same prefix whole, and a longer prefix overrides a shorter one
(docs/runtime-facts.md). The old drop-in stated only the loopback mirror, so for the
import's duration the repository lost its other mirrors (an ImageDigestMirrorSet's), its
``insecure`` and its ``blocked``. Any pull of the repository on the node then went to the
source registry, over TLS, even when the source was blocked (``NeverContactSource``).

Here, with the real CRI-O, an IDMS-style drop-in gives repository ``merge-test/app`` a mirror
and ``insecure = true``, and blocks ``merge-test/blocked``. With the mirror drop-in in place
(the ``MirrorDropin`` and ``BundleServer`` the importer uses), the runtime pulls:

* the bundle's images through the loopback mirror, the blocked repository's included (a
  blocked source's mirrors are still used);
* an image only the IDMS mirror holds: that mirror survived;
* an image only the source holds: the restated location still leads to it;

and it refuses an image of the blocked repository that only its source holds: the block
survived too. ``insecure`` is checked in the drop-in's text: CRI-O reaches any registry on
127.0.0.0/8 over plain HTTP whatever registries.conf says (docs/runtime-facts.md), so on
loopback only the text can show it.
"""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodeagent.adapters.bundles.mirror import MirrorDropin
from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.http.mirror import BundleServer
from nodeagent.bundles.mirror import DROPIN_NAME, mirror_repositories, served_blobs
from nodeagent.errors import NodeAgentError
from tests.testenv.crio import Crio
from tests.testenv.images import BuiltImage, LayerSpec, TestImage, push
from tests.testenv.oci_layout import OciLayout, write_oci_layout
from tests.testenv.registry import Registry

PULL_TIMEOUT_S = 120.0


def built(repository: str, seed: int) -> BuiltImage:
    return TestImage(repository, [LayerSpec(32 * 1024, seed)]).build()


def idms_dropin(host: str) -> str:
    """What an ImageDigestMirrorSet (and a blocked source) render, for two repositories."""
    return f"""
[[registry]]
prefix = "{host}/merge-test/app"
location = "{host}/merge-test/app"
insecure = true

[[registry.mirror]]
location = "{host}/merge-test-mirror/app"
insecure = true
pull-from-mirror = "digest-only"

[[registry]]
prefix = "{host}/merge-test/blocked"
location = "{host}/merge-test/blocked"
insecure = true
blocked = true
"""


@pytest.fixture
async def bundle(
    tmp_path: Path, registry: Registry
) -> AsyncIterator[tuple[OciLayout, BundleServer]]:
    app, locked = built("merge-test/app", 91), built("merge-test/blocked", 92)
    layout = write_oci_layout(tmp_path / "bundle", registry.host, [app, locked])
    async with BundleServer(layout.root, served_blobs(layout.manifest)) as server:
        yield layout, server


async def test_an_import_keeps_the_repositorys_mirrors_insecure_and_blocked(
    fresh_crio: Crio, registry: Registry, bundle: tuple[OciLayout, BundleServer]
) -> None:
    layout, server = bundle
    host = registry.host
    only_on_mirror = built("merge-test-mirror/app", 93)
    only_at_source = built("merge-test/app", 94)
    only_at_blocked_source = built("merge-test/blocked", 95)
    for image in (only_on_mirror, only_at_source, only_at_blocked_source):
        await asyncio.to_thread(push, registry.url, image.repository, image)
    (fresh_crio.registries_dir / "50-idms.conf").write_text(idms_dropin(host))

    dropin = MirrorDropin(fresh_crio.registries_dir / DROPIN_NAME, fresh_crio.registries_conf)
    repositories = mirror_repositories(image.ref for image in layout.manifest.images)
    assert dropin.write(repositories, server.mirror_host)
    await asyncio.to_thread(fresh_crio.reload)
    written = tomllib.loads(dropin.path.read_text())["registry"]
    assert [(e["prefix"], e.get("insecure"), e.get("blocked")) for e in written] == [
        (f"{host}/merge-test/app", True, None),
        (f"{host}/merge-test/blocked", True, True),
    ]
    assert [m["location"] for m in written[0]["mirror"]] == [
        f"{server.mirror_host}/merge-test/app",
        f"{host}/merge-test-mirror/app",
    ]

    async with CriClient(fresh_crio.endpoint) as cri:
        for bundled in layout.images:  # through the loopback mirror, the blocked one's too
            await cri.pull_image(layout.ref(bundled), timeout_s=PULL_TIMEOUT_S)
        await server.settled()
        assert server.counters.blobs_served >= 2
        # Only the IDMS mirror holds it: the mirror is still there.
        await cri.pull_image(f"{host}/merge-test/app@{only_on_mirror.digest}")
        # Only the source holds it (plain HTTP; CRI-O allows that on loopback anyway).
        await cri.pull_image(f"{host}/merge-test/app@{only_at_source.digest}")
        # Only the blocked source holds it: the source is still blocked.
        with pytest.raises(NodeAgentError, match="blocked"):
            await cri.pull_image(f"{host}/merge-test/blocked@{only_at_blocked_source.digest}")
        assert (
            await cri.image_status(f"{host}/merge-test/blocked@{only_at_blocked_source.digest}")
            is None
        )

    assert dropin.remove()
    await asyncio.to_thread(fresh_crio.reload)
