"""The demo's end: what a technician runs on the node, the metrics, and where to read more."""

from __future__ import annotations

import json

from tests.testenv.demo.metrics import show_scrape
from tests.testenv.demo.node import DemoNode
from tests.testenv.demo.story import Story

READ_MORE = (
    ("README.md", "what nodeagent is, and the two commands: make demo, make test"),
    ("docs/operations.md", "running it on a node: configuration, status, journal, recovery"),
    ("docs/pins.md", "how images are pinned in CRI-O and what unpinning does"),
    ("docs/bundle-format.md", "signed bundles: the format, keys, anti-rollback"),
    ("docs/store.md", "the node store: copy from the stick, restore after a wipe"),
    ("docs/offline.md", "offline readiness: what must hold for a node without a registry"),
    ("docs/site.md", "site fan-out: one stick, every node"),
    ("docs/security.md", "what is trusted, and why"),
    ("docs/testing.md", "the test environment this demo runs on"),
)


def wrap_up(node: DemoNode, story: Story) -> None:
    agent = node.agent
    with story.chapter("e. what a technician sees on the node"):
        story.explain(
            """`nodeagent status` reads the status file the daemon keeps. OfflineReady is False
            here only because this machine has no kubelet configuration for it to check."""
        )
        story.command("nodeagent status", agent.cli("status"))
        result = agent.cli("status", "--json")
        doc = json.loads(result.stdout)
        story.say("    $ nodeagent status --json   (the same, for scripts; its top-level keys:)")
        story.say(f"      {', '.join(sorted(doc))}")
        story.explain("The Prometheus endpoint ([metrics], off by default, on loopback):")
        show_scrape(node.metrics_url, story)
    story.say("")
    story.say("==> read more (in this repository)")
    for path, what in READ_MORE:
        story.say(f"    {path:24} {what}")
