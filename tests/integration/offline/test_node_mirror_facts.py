"""check-offline's node mirror facts from a real store: the images it holds, and whether the
drop-in the registries.conf helper writes mirrors each of their repositories."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from nodeagent.adapters.bundles.mirror import MirrorDropin
from nodeagent.adapters.offline_mirror import mirror_facts
from nodeagent.bundles.mirror import mirror_repositories
from nodeagent.config import Config
from nodeagent.config.mirror import NODE_MIRROR_DROPIN_NAME
from nodeagent.offline.checks import run_checks
from nodeagent.offline.facts import Facts
from nodeagent.offline.findings import Finding
from nodeagent.offline.mirror_checks import MIRROR_DROPIN_MISSING, MIRROR_DROPIN_STALE
from nodeagent.references import parse_pinned_image_ref
from tests.testenv.node_mirror import held_store


def test_the_store_s_images_and_the_dropin(tmp_path: Path) -> None:
    held = held_store(tmp_path)
    config = Config.default(root=tmp_path / "root")
    config = dataclasses.replace(config, store=dataclasses.replace(config.store, path=held.root))
    registries_dir = config.runtime.registries_dir
    refs = held.bundle_refs + held.set_refs

    def reasons() -> list[str]:
        problems: list[Finding] = []
        stored, dropin = mirror_facts(config, problems, store_is_empty=False)
        assert problems == []
        assert stored == frozenset(r.rpartition("@")[2] for r in refs)
        return [x.reason for x in run_checks(Facts(mirror_dropin=dropin)).findings]

    assert reasons() == [MIRROR_DROPIN_MISSING]
    registries_dir.mkdir(parents=True, exist_ok=True)
    dropin = MirrorDropin(registries_dir / NODE_MIRROR_DROPIN_NAME)
    repositories = mirror_repositories(parse_pinned_image_ref(r) for r in refs)
    dropin.write(repositories[1:], config.mirror.listen)  # one repository left out
    assert reasons() == [MIRROR_DROPIN_STALE]
    dropin.write(repositories, config.mirror.listen)
    assert reasons() == []
