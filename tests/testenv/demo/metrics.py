"""The demo's metrics: ``[metrics]`` turned on when this tree's daemon knows it, and a scrape.

The endpoint (issue 18) is plain Prometheus text on ``GET /metrics``, on loopback. A tree
whose configuration has no ``[metrics]`` table refuses the key (``nodeagent check-config``
names it); the demo then prints that metrics are not built in this tree and goes on.
"""

from __future__ import annotations

import socket
import subprocess
import urllib.error
import urllib.request

from tests.testenv.agent import Agent
from tests.testenv.demo.story import Story
from tests.testenv.waiting import wait_for

NOT_BUILT = "metrics not built in this tree"


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def metrics_config(agent: Agent, story: Story) -> tuple[str | None, str]:
    """``(url, toml)``: the scrape URL and the ``[metrics]`` table to add to the daemon's
    config, or ``(None, "")`` when ``check-config`` refuses the table (written already)."""
    listen = f"127.0.0.1:{free_loopback_port()}"
    toml = f'\n[metrics]\nenabled = true\nlisten = "{listen}"\n'
    probe = agent.config_file.with_name("metrics-probe.toml")
    probe.write_text(agent.config_file.read_text() + toml)
    cmd = [agent.python, "-m", "nodeagent", "--config", str(probe), "check-config"]
    result = subprocess.run(
        cmd, capture_output=True, text=True, env=agent.env(), cwd=agent.base, check=False
    )
    probe.unlink()
    if result.returncode == 0:
        return f"http://{listen}/metrics", toml
    story.say(f"    ({NOT_BUILT}: check-config refused [metrics]: {result.stderr.strip()[:160]})")
    return None, ""


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


def show_scrape(url: str | None, story: Story, *, max_lines: int = 12) -> None:
    """Scrape ``url`` and print a few ``nodeagent_`` samples, or say metrics are not built."""
    if url is None:
        story.say(f"    {NOT_BUILT}: skipped")
        return
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
