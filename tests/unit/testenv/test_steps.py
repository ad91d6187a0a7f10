"""The printed steps of ``prepare`` and ``make demo``, and the demo's journal filter."""

from __future__ import annotations

import pytest

from tests.testenv.demo.metrics import one_per_family
from tests.testenv.demo.story import MAX_LINE, Story, journal_lines
from tests.testenv.steps import Steps


def test_a_step_says_when_it_starts_and_how_long_it_took() -> None:
    lines: list[str] = []
    steps = Steps(lines.append, prefix="testenv: ")
    with steps.step("the CRI-O build"):
        steps.note("cached")
    assert lines[:2] == ["testenv: the CRI-O build", "    cached"]
    assert lines[2].startswith("    done in ") and lines[2].endswith(" s")
    assert [title for title, _ in steps.timings] == ["the CRI-O build"]


def test_a_failing_step_says_so_and_is_not_timed() -> None:
    lines: list[str] = []
    steps = Steps(lines.append)
    with pytest.raises(RuntimeError), steps.step("Debian packages"):
        raise RuntimeError("apt-get failed")
    assert lines[0] == "==> Debian packages"
    assert lines[1].startswith("    failed after ")
    assert steps.timings == []


def test_journal_lines_keep_the_named_events_in_order_warnings_included() -> None:
    text = "\n".join([
        "daemon_started: config=/etc/nodeagent/config.toml",
        "image_pulled: image=a seconds=0.1",
        "WARNING Pinned images are gone from the container runtime. "
        "pinned_images_lost: reason=RuntimeStorageWiped",
        "set_pinned_elsewhere: not this one",
        "set_pinned: set=s " + "x" * 400,
    ])  # fmt: skip
    found = journal_lines(text, ("pinned_images_lost", "set_pinned", "daemon_started"))
    assert found[:2] == [
        "daemon_started: config=/etc/nodeagent/config.toml",
        "WARNING Pinned images are gone from the container runtime. "
        "pinned_images_lost: reason=RuntimeStorageWiped",
    ]
    assert len(found) == 3
    assert len(found[2]) == MAX_LINE and found[2].endswith("...")


def test_the_story_records_milestones_and_the_first_pin_once() -> None:
    lines: list[str] = []
    story = Story(say=lines.append)
    story.pinned_first()
    first = story.first_pin_s
    story.pinned_first()
    story.milestone("you may remove the stick")
    assert story.first_pin_s == first
    assert story.milestones == ["you may remove the stick"]
    assert lines[-1] == "    ** you may remove the stick"


def test_the_scrape_shows_the_first_sample_of_each_metric() -> None:
    samples = [
        'nodeagent_set_images_wanted{set="a"} 5.0',
        'nodeagent_set_images_wanted{set="b"} 3.0',
        "nodeagent_store_bytes 1024.0",
        'nodeagent_pull_duration_seconds_bucket{le="1.0"} 0.0',
        "nodeagent_pull_duration_seconds_count 2.0",
        "nodeagent_pull_duration_seconds_sum 0.5",
        'nodeagent_set_images_pinned{set="a"} 5.0',
    ]
    assert one_per_family(samples) == [samples[0], samples[2], samples[4], samples[6]]
