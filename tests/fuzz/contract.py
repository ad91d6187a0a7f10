"""The property every fuzz harness checks, and the example counts ``make fuzz`` reports.

For any input, an entry point returns a result or raises one of the errors its contract
names (a ``NodeAgentError`` with a reason code, or ``strict.MalformedInput`` for a kernel
parser), never any other exception; it finishes within a CPU-time bound; and every message
it produces (the error's, a result's problem messages, the log events it emits) is short
and holds no control characters, bidi overrides or lone surrogates.

``outcome`` runs one call under that property; ``check_text`` checks one message.
``COUNTS`` holds, per entry point, the inputs that reached it in this process
(tests/fuzz/conftest.py writes them out for tools/fuzz_report.py): an ``outcome`` call counts
one for its entry point; ``reaching`` counts the calls that reach a function a parser calls
only for the inputs that got that far (``release_of`` at the end of ``parse_manifest``).
"""

from __future__ import annotations

import gc
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, TypeVar

from structlog.testing import capture_logs

from nodeagent.errors import NodeAgentError
from tests.capabilities import skip_for

T = TypeVar("T")

MAX_MESSAGE_CHARS: Final = 2000
"""A message names a few clipped inputs (~300 characters each) in a sentence or two."""
CPU_BOUND_S: Final = 2.0
"""CPU seconds one input may take. Inputs are at most ~100 KB: linear parsing takes
milliseconds; the quadratic challenge parser took 7-30 s on 32-64 KB (issue 13)."""
_UNSAFE: Final = re.compile(
    r"[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)

COUNTS: Counter[str] = Counter()
"""Inputs run per entry point in this process."""
SECONDS: dict[str, float] = {}
"""Wall-clock seconds spent in calls per entry point in this process."""

_BUDGET_S = float(os.environ.get("NODEAGENT_FUZZ_BUDGET_S", "0") or 0)
_STARTED: dict[str, float] = {}


def check_text(text: str, where: str) -> None:
    """``text`` is short and safe to show (journal, terminal)."""
    assert len(text) <= MAX_MESSAGE_CHARS, f"{where}: a message of {len(text)} characters"
    unsafe = _UNSAFE.search(text)
    assert unsafe is None, f"{where}: unescaped {unsafe.group()!r} in {text[:400]!r}"


def check_texts(texts: Iterable[str], where: str) -> None:
    for text in texts:
        check_text(text, where)


def outcome(
    entry: str,
    call: Callable[[], T],
    *,
    allowed: tuple[type[BaseException], ...] = (NodeAgentError,),
    is_message_shown: bool = True,
) -> T | BaseException:
    """Run ``call``: its result, or the allowed exception it raised (message checked).

    Any other exception propagates, so hypothesis reports and shrinks it. An internal
    exception whose text no person reads as it is (``is_message_shown=False``) is not
    checked. With
    ``NODEAGENT_FUZZ_BUDGET_S`` set (make fuzz), a harness that has run that long is
    skipped, its count kept: the budget ran out before ``max_examples``.
    """
    _stop_when_over_budget(entry)
    COUNTS[entry] += 1
    result: T | BaseException
    # The cyclic collector is off during the call: a full collection walks the whole heap,
    # which a long hypothesis run grows to gigabytes (1.6 s of CPU at 20 million objects),
    # and charged to whichever input it interrupts it failed a 15 ms parse (make fuzz,
    # token answers). Reference counting still frees the call's garbage as it goes.
    gc.disable()
    wall = time.monotonic()
    cpu = time.process_time()
    try:
        with capture_logs() as logs:
            try:
                result = call()
            except allowed as exc:
                result = exc
    finally:
        used_s = time.process_time() - cpu
        gc.enable()
    SECONDS[entry] = SECONDS.get(entry, 0.0) + time.monotonic() - wall
    assert used_s <= CPU_BOUND_S, f"{entry} took {used_s:.1f} s of CPU on one input"
    if isinstance(result, NodeAgentError):
        check_text(result.message, f"{entry} raised {type(result).__name__}")
    elif isinstance(result, BaseException) and is_message_shown:
        check_text(str(result), f"{entry} raised {type(result).__name__}")
    for event in logs:
        check_texts(_strings(event), f"{entry} logged {event.get('event')!r}")
    return result


@contextmanager
def reaching(entry: str, owner: object, name: str) -> Iterator[None]:
    """Within the block, count under ``entry`` every call of ``owner.name`` (the name the
    caller looks up: ``nodeagent.bundles.manifest`` and ``release_of``), then restore it."""
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        COUNTS[entry] += 1
        return real(*args, **kwargs)

    setattr(owner, name, counted)
    try:
        yield
    finally:
        setattr(owner, name, real)


def _strings(event: Mapping[str, Any]) -> list[str]:
    return [value for value in event.values() if isinstance(value, str)]


def _stop_when_over_budget(entry: str) -> None:
    if not _BUDGET_S:
        return
    harness = os.environ.get("PYTEST_CURRENT_TEST", entry).split(" ")[0]
    started = _STARTED.setdefault(harness, time.monotonic())
    if time.monotonic() - started > _BUDGET_S:
        skip_for(
            "unbudgeted", f"fuzz budget of {_BUDGET_S:g} s ran out after {COUNTS[entry]} inputs"
        )
