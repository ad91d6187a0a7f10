"""The pin path's service: specs -> present? -> disk admission -> pulls -> pins -> status.

``Reconciler.run`` is the sync loop: a sync on every ``request_sync`` (a spec or
drop-in changed, a bundle was imported), a retry with backoff after a sync that
could not run or that left sets failing for a transient cause, and a full re-check
every ``SyncSchedule.resync_interval_s``.

Modules: ``loop`` (when syncs run: the schedule, backoffs, the report port),
``passes`` (what one sync learns and the set statuses built from it),
``reconciler`` (the service).
"""

from nodeagent.sync.loop import SyncReport, SyncSchedule, Waiter, wait_event
from nodeagent.sync.passes import index_names, set_refs
from nodeagent.sync.reconciler import Reconciler

__all__ = [
    "Reconciler",
    "SyncReport",
    "SyncSchedule",
    "Waiter",
    "index_names",
    "set_refs",
    "wait_event",
]
