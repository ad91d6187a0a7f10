"""A set name as long as the API allows (253 characters) through a bundle, with real CRI-O.

The bundle's set file is ``bundle-<id>-<set>.yaml``; with a 128-character bundle id and a
253-character set name that is far beyond NAME_MAX (255 bytes), and its atomic write's
temporary name is longer still. The name is hash-suffixed (``specs.file_stem``): the import
succeeds and the set is pinned under its full name.
"""

from __future__ import annotations

import json
from pathlib import Path

from nodeagent.adapters.cri.client import CriClient
from nodeagent.bundles import minisign
from nodeagent.bundles.handover import set_file_name
from tests.testenv.agent import Agent, set_state
from tests.testenv.bundles import make_bundle
from tests.testenv.crio import Crio
from tests.testenv.images import make_image_set, push
from tests.testenv.registry import Registry

SET_NAME = "edge-apps." + "a" * 60 + "." + "b" * 60 + "." + "c" * 60 + "." + "d" * 60
BUNDLE_ID = "line-3-" + "x" * 121


async def test_a_253_character_set_name_is_imported_and_pinned_from_a_bundle(
    fresh_crio: Crio, tmp_path: Path
) -> None:
    assert (len(SET_NAME), len(BUNDLE_ID)) == (253, 128)
    public, secret = minisign.generate_keypair(comment="long names")
    work = tmp_path / "factory"
    work.mkdir()
    with Registry(work / "registry") as registry:
        images = make_image_set(
            1, layer_size_bytes=64 << 10, shared_base_size_bytes=64 << 10, seed=5
        )
        refs = [
            push(registry.url, i.repository, i.build()).reference(registry.host) for i in images
        ]
        bundle = make_bundle(
            work, registry, refs, public, secret, set_name=SET_NAME, bundle_id=BUNDLE_ID
        )

    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(public)
    imported = agent.cli("bundle", "import", str(bundle), "--json")
    assert imported.returncode == 0, imported.stdout + imported.stderr
    report = json.loads(imported.stdout[imported.stdout.index("{") :])
    assert report["state"] == "imported", report
    assert report["pinnedImageSets"] == [SET_NAME]

    (written,) = agent.persistent_dir.glob("bundle-*.yaml")
    assert written.name == set_file_name(BUNDLE_ID, SET_NAME)
    assert len(written.name.encode()) <= 212  # 'bundle-' + 200 + '.yaml'
    assert f"name: {SET_NAME}" in written.read_text()
    status = agent.status()
    assert status is not None
    assert set_state(status, SET_NAME) == "Pinned"
    async with CriClient(fresh_crio.endpoint) as cri:
        found = await cri.image_status(refs[0])
    assert found is not None and found.is_pinned
