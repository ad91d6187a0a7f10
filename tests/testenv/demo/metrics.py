"""The demo's metrics: ``[metrics]`` turned on for the demo's daemon, and a scrape.

The endpoint (docs/alerts.md, decision 0046) is Prometheus text on ``GET /metrics``, on a
free loopback port (not the default 9448, which another daemon on this machine may hold).
"""

from __future__ import annotations

import urllib.error
import urllib.request

from tests.testenv.demo.story import Story
from tests.testenv.registry import free_port
from tests.testenv.waiting import wait_for


def metrics_config() -> tuple[str, str]:
    """``(url, toml)``: the scrape URL and the ``[metrics]`` table for the daemon's config."""
    listen = f"127.0.0.1:{free_port()}"
    return f"http://{listen}/metrics", f'\n[metrics]\nenabled = true\nlisten = "{listen}"\n'


def _scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (loopback URL built here)
            return str(response.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def one_per_family(samples: list[str]) -> list[str]:
    """The first sample of each metric (the name before its labels or value), in order; a
    histogram by its ``_count`` (its buckets and ``_sum`` left out)."""
    seen: set[str] = set()
    found = []
    for line in samples:
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith(("_bucket", "_created")):
            continue
        name = name.removesuffix("_count").removesuffix("_sum")
        if name not in seen:
            seen.add(name)
            found.append(line)
    return found


def show_scrape(url: str, story: Story, *, max_lines: int = 12) -> None:
    """Scrape ``url`` and print a few ``nodeagent_`` samples."""
    text = wait_for(lambda: _scrape(url), timeout_s=20, what=f"a scrape of {url}")
    samples = [line for line in text.splitlines() if line.startswith("nodeagent_")]
    shown = one_per_family(samples)[:max_lines]
    story.say(
        f"    $ curl -s {url} | grep ^nodeagent_   ({len(samples)} samples; "
        f"one line from each of the first {len(shown)} metrics):"
    )
    for line in shown:
        story.say(f"      {line}")
    story.milestone(f"metrics scraped: {len(samples)} nodeagent_ samples")
