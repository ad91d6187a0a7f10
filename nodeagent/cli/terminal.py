"""What the bundle commands show on a terminal: one self-overwriting progress line on stderr
(``bundle create``'s blobs, ``bundle verify``'s hashing, ``bundle import``'s steps) and their
lines on stdout."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from nodeagent.status import BundleReport, bundle_line
from nodeagent.strict import clip
from nodeagent.units import format_bytes

_PROGRESS_INTERVAL_S = 0.2


class TerminalProgress:
    """One self-overwriting status line on stderr, at most every 0.2 s."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.shown_at_s: float | None = None
        self.width = 0

    def show(self, text: str, *, is_final: bool = False) -> None:
        now_s = self.clock()
        is_due = self.shown_at_s is None or now_s - self.shown_at_s >= _PROGRESS_INTERVAL_S
        if not (is_final or is_due):
            return
        self.shown_at_s = now_s
        sys.stderr.write("\r" + text.ljust(self.width))
        self.width = len(text)
        sys.stderr.flush()

    def blobs(self, blobs_done: int, blobs_total: int, bytes_done: int, bytes_total: int) -> None:
        text = format_blob_progress(blobs_done, blobs_total, bytes_done, bytes_total)
        self.show(text, is_final=blobs_done == blobs_total and bytes_done >= bytes_total)

    def hashed(self, bytes_done: int, bytes_total: int) -> None:
        text = f"hashed {format_bytes(bytes_done)}/{format_bytes(bytes_total)}"
        self.show(text, is_final=bytes_done >= bytes_total)

    def bundle(self, report: BundleReport) -> None:
        """An import's steps: copying into the store and importing with bytes, MB/s, ETA."""
        line = (
            bundle_line(report)
            or f"bundle {clip(report.bundle_id or report.source)}: {report.state}"
        )
        self.show(line, is_final=report.progress is None)

    def close(self) -> None:
        if self.width:
            sys.stderr.write("\n")


def format_blob_progress(
    blobs_done: int, blobs_total: int, bytes_done: int, bytes_total: int
) -> str:
    """``blobs 12/40, 130 MiB/420 MiB``."""
    return (
        f"blobs {blobs_done}/{blobs_total}, {format_bytes(bytes_done)}/{format_bytes(bytes_total)}"
    )


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
