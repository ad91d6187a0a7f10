"""``make demo``'s steps do not rot: each half of the story runs here, its milestones checked.

The demo (``tests/testenv/demo/``) runs the real daemon, CRI-O, a registry, udevd with a
loop-device stick and, for the site, three network namespaces. The node half (a set from a
registry, the stick, the power cut, status and metrics) takes about 5 s here, the site half
about 8 s, so both run in ``make test``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.testenv.demo.__main__ import run_story
from tests.testenv.demo.site import SKIPPED
from tests.testenv.demo.story import Story

pytestmark = pytest.mark.integration


def told(tmp_path: Path, part: str) -> tuple[Story, str]:
    lines: list[str] = []
    story = Story(say=lines.append)
    run_story(tmp_path, story, parts=(part,))
    return story, "\n".join(lines)


@pytest.mark.timeout(180)
def test_the_node_story_pins_from_the_registry_then_the_stick_then_restores_after_a_wipe(
    tmp_path: Path,
) -> None:
    story, text = told(tmp_path, "node")
    assert story.milestones[0] == "set demo-apps pinned from the registry (5 images)"
    assert re.fullmatch(r"you may remove the stick \(/dev/loop\d+\): .*", story.milestones[1])
    assert story.milestones[2] == "set line-3 pinned from the stick, with no registry"
    assert story.milestones[3] == "8 images restored from the node store, none from a registry"
    assert story.first_pin_s is not None
    # the journal lines a technician reads, in the story's order
    order = [
        "| The images of a PinnedImageSet are pinned. set_pinned: set=demo-apps",
        "| The upgrade bundle is authentic. bundle_verified: bundle=line-3-test",
        "| The bundle is in the node's store: the medium may be removed. "
        'bundle_stored: bundle=line-3-test bytes="8 MiB"',
        "| The images of a PinnedImageSet are pinned. set_pinned: set=line-3",
        "| WARNING Pinned images are gone from the container runtime. "
        "pinned_images_lost: reason=RuntimeStorageWiped images=8",
        "| Images were restored from nodeagent's local store. "
        'images_restored_from_store: images=8 failed=0 message="restored 8 images',
        "set demo-apps: Pinned (generation 1/1), images 5 pinned",
    ]
    places = [text.find(needle) for needle in order]
    assert -1 not in places, [n for n, p in zip(order, places, strict=True) if p == -1]
    assert places == sorted(places), text
    (scraped,) = [m for m in story.milestones if m.startswith("metrics scraped")]
    assert not scraped.startswith("metrics scraped: 0 ")


@pytest.mark.timeout(240)
def test_the_site_story_pins_one_stick_on_three_nodes(tmp_path: Path) -> None:
    story, text = told(tmp_path, "site")
    if SKIPPED in text:
        pytest.skip(text[text.index(SKIPPED) :].splitlines()[0])
    assert story.milestones == ["3 nodes pinned from one stick"]
    for node in ("node-0", "node-1", "node-2"):
        assert f"{node}: line-3 pinned" in text
    assert text.count("| bundle_fetched: bundle=line-3-test") == 2
