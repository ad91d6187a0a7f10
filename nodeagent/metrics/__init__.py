"""What the node counts for its OpenMetrics endpoint (``[metrics]``, docs/operations.md).

The features report events through the ``Metrics`` port (``recorder``): the Reporter its
syncs, pulls, bundles and the offline drill; disk admission its decisions and the sizes
of the pulls it admitted; the daemon's store, restore and peer tasks their bytes. With
metrics off the port is ``NO_METRICS`` (it does nothing, and prometheus_client is never
imported); with metrics on it is a ``Recorder``, whose ``snapshot`` the endpoint reads.

Host interfaces: none. Everything here is pure; the endpoint (prometheus_client's
exposition and its HTTP server on loopback) is ``nodeagent.adapters.metrics``.

A scrape never waits on a sync: it reads a snapshot the recorder copies under its own
lock, which a reporting call holds only while it adds a number (never across an await).
Labels are bounded: no image name is ever a label; set names are, up to ``MAX_SET_LABELS``
(the rest are summed under ``OTHER_SETS``); reason codes are, up to ``MAX_REASON_LABELS``.

Modules: ``port`` (the port and its no-op; the only one a daemon with metrics off loads),
``recorder`` (the ``Recorder``), ``series`` (the snapshot's values and the label caps).
"""

from __future__ import annotations

from nodeagent.metrics.port import NO_METRICS as NO_METRICS
from nodeagent.metrics.port import Metrics as Metrics
