"""The daemon's report hook: a release bundle just imported has its signatures published."""

from __future__ import annotations

from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import structlog

from nodeagent.config import load_config
from nodeagent.daemon.bundles import with_release_signatures
from nodeagent.status import BundleReport

STEPS = ("release 4.16.3 is pinned ...", "nodeagent site wait ...")


async def test_a_release_bundle_just_imported_is_published_once(tmp_path: Path) -> None:
    config = load_config(Path("/etc/nodeagent/config.toml"), root=tmp_path)
    seen: list[BundleReport] = []
    spawned: list[tuple[str, Coroutine[Any, Any, None]]] = []
    hook = with_release_signatures(
        config, seen.append, None, lambda name, work: spawned.append((name, work))
    )
    reports = [
        BundleReport("/m", "verified", "r1", next_steps=STEPS),
        BundleReport("/m", "imported", "plain"),
        BundleReport("/m", "imported", "r1", next_steps=STEPS),
        BundleReport("/m", "imported", "r1", next_steps=STEPS, is_already_imported=True),
    ]
    for report in reports:
        hook(report)
    assert seen == reports
    assert [name for name, _ in spawned] == ["release-signatures r1"]
    with structlog.testing.capture_logs() as logs:
        await spawned[0][1]  # no such bundle in the (empty) store, no API: said, not raised
    (entry,) = logs
    assert (entry["event"], entry["bundle"]) == ("release_signatures_not_applied", "r1")
    assert "nodeagent bundle release-signatures r1" in entry["action"]
