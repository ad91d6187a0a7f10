"""``python -m tests.testenv.demo [--skip-site | --only node|site]`` (``make demo``)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from tests.testenv.__main__ import prepare
from tests.testenv.demo.node import (
    demo_node,
    import_from_stick,
    make_factory,
    pin_from_registry,
    power_cut,
)
from tests.testenv.demo.site import site_fanout
from tests.testenv.demo.story import Story
from tests.testenv.demo.wrapup import wrap_up

PARTS = ("node", "site")


def run_story(base: Path, story: Story, *, parts: tuple[str, ...] = PARTS) -> None:
    """The demo's steps under ``base``: ``node`` (a, b, c, e), ``site`` (d)."""
    factory = make_factory(base / "factory", story)
    with ExitStack() as stack:
        node = None
        if "node" in parts:
            node = stack.enter_context(demo_node(base / "node", story, factory))
            pin_from_registry(node, story)
            import_from_stick(node, story, factory, base / "stick")
            power_cut(node, story, factory)
            node.udevd.stop()  # the site's stick has a udevd of its own, in node 0's namespace
        if "site" in parts:
            site_fanout(base / "site", story, factory)
        if node is not None:
            wrap_up(node, story)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testenv.demo", description=__doc__)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--skip-site", action="store_true", help="leave out the three-node site")
    which.add_argument(
        "--only", choices=PARTS, help="one half: the node (a, b, c, e) or the site (d)"
    )
    args = parser.parse_args(argv)
    parts = (args.only,) if args.only else PARTS[:1] if args.skip_site else PARTS
    story = Story()
    prepare(nspawn_root=False, with_kube=False, say=story.say)
    base = Path(tempfile.mkdtemp(prefix="nodeagent-demo-"))
    try:
        run_story(base, story, parts=parts)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    story.summary()
    story.say("demo finished; everything it created is removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
