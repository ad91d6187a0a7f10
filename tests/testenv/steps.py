"""Steps that say what they do and how long they took: ``prepare`` and ``make demo`` use them.

``Steps(say)`` numbers nothing and hides nothing: ``with steps.step("the CRI-O build"):``
prints ``==> the CRI-O build`` when the step starts and ``    done in 12.3 s`` when it ends
(or ``    failed after 1.2 s`` when it raises), so a first run that builds for minutes is
never silent. ``steps.total()`` is the time since the ``Steps`` was made.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Say = Callable[[str], None]


def say_now(text: str) -> None:
    """``print`` that flushes: a pipe (``make demo | tee``) sees each line as it is said."""
    print(text, flush=True)


class Steps:
    """A printer of timed steps; ``say`` receives every line (``print`` by default)."""

    def __init__(self, say: Say = say_now, *, prefix: str = "==> ") -> None:
        self.say = say
        self.prefix = prefix
        self.started = time.monotonic()
        self.timings: list[tuple[str, float]] = []
        """Each finished step's title and seconds, in order."""

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        self.say(f"{self.prefix}{title}")
        started = time.monotonic()
        try:
            yield
        except BaseException:
            self.say(f"    failed after {time.monotonic() - started:.1f} s")
            raise
        elapsed = time.monotonic() - started
        self.timings.append((title, elapsed))
        self.say(f"    done in {elapsed:.1f} s")

    def note(self, text: str) -> None:
        """A line inside the current step (what was cached, what was built)."""
        self.say(f"    {text}")

    def total(self) -> float:
        return time.monotonic() - self.started
