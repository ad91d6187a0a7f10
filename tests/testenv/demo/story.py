"""How the demo talks: chapters with their elapsed time, short explanations, the daemon's
journal lines, commands with their output, and milestones a test can look for.

Everything the demo prints goes through ``Story.say`` (printed and flushed unless a test
collects the lines). The daemon writes one line per event (``The bundle is in the node's
store: the medium may be removed. bundle_stored: bundle=...``, ``nodeagent/logs.py``);
under systemd those are the lines ``journalctl -u nodeagent`` shows, so the demo prints the
same lines from the daemon's output file.
"""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

from nodeagent.logs import event_of
from tests.testenv.steps import Say, Steps, say_now

MAX_LINE = 220
"""A journal line longer than this is cut (the demo shows what happened, not every field)."""


def journal_lines(text: str, events: tuple[str, ...]) -> list[str]:
    """The lines of a daemon's output whose event is one of ``events``, in order."""
    found = []
    for line in text.splitlines():
        if event_of(line) in events:
            found.append(line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "...")
    return found


class Story:
    """The demo's printer: ``chapter`` (a timed step), ``explain``, ``journal``, ``command``,
    ``milestone``; ``first_pin_s`` once a set is pinned for the first time."""

    def __init__(self, say: Say = say_now) -> None:
        self.say = say
        self.steps = Steps(say)
        self.milestones: list[str] = []
        self.first_pin_s: float | None = None

    @contextmanager
    def chapter(self, title: str) -> Iterator[None]:
        self.say("")
        with self.steps.step(title):
            yield

    def explain(self, text: str) -> None:
        for line in textwrap.wrap(" ".join(text.split()), width=92):
            self.say(f"    {line}")

    def journal(self, text: str, events: tuple[str, ...], *, who: str = "nodeagent") -> None:
        """The lines of ``text`` (a daemon's output) for ``events``, as journalctl shows them."""
        lines = journal_lines(text, events)
        self.say(f"    journalctl -u nodeagent ({who}), {len(lines)} lines:")
        for line in lines:
            self.say(f"      | {line}")

    def command(
        self, shown: str, result: subprocess.CompletedProcess[str], *, max_lines: int = 40
    ) -> None:
        """``$ shown`` and what it printed (at most ``max_lines`` lines)."""
        self.say(f"    $ {shown}")
        lines = (result.stdout + result.stderr).splitlines()
        for line in lines[:max_lines]:
            self.say(f"      {line}")
        if len(lines) > max_lines:
            self.say(f"      ... ({len(lines) - max_lines} more lines)")

    def milestone(self, text: str) -> None:
        """Something the story promised happened (tests/integration/testenv/test_demo.py)."""
        self.milestones.append(text)
        self.say(f"    ** {text}")

    def pinned_first(self) -> None:
        if self.first_pin_s is None:
            self.first_pin_s = self.steps.total()
            self.say(f"    first set pinned {self.first_pin_s:.1f} s after the demo started")

    def summary(self) -> None:
        self.say("")
        self.say("==> timings")
        for title, seconds in self.steps.timings:
            self.say(f"    {seconds:6.1f} s  {title}")
        if self.first_pin_s is not None:
            self.say(f"    first pin after {self.first_pin_s:.1f} s")
        self.say(f"    total {self.steps.total():.1f} s")
