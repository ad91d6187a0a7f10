"""What nodeagent remembers between runs, and how it is kept and rebuilt.

Per PinnedImageSet: its generations (they never decrease), the fingerprint of its image
list, the images it had pinned, and the spec file it came from (``records``); the documents
on disk, their last good copies and the rebuild of a damaged ledger (``store``).
"""

from nodeagent.ledger.records import MAX_GENERATION, Ledger, SetRecord
from nodeagent.ledger.store import (
    BOOT_PINS,
    LAST_GOOD,
    LEDGER,
    STATUS,
    LedgerStore,
    LoadedLedger,
    Repair,
    save_repairing,
    status_seeds,
)

__all__ = [
    "BOOT_PINS",
    "LAST_GOOD",
    "LEDGER",
    "MAX_GENERATION",
    "STATUS",
    "Ledger",
    "LedgerStore",
    "LoadedLedger",
    "Repair",
    "SetRecord",
    "save_repairing",
    "status_seeds",
]
