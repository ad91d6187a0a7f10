"""``[metrics]``: the OpenMetrics endpoint (docs/operations.md, "Metrics and alerts").

Its own module beside ``settings`` (which holds every other table) to keep that file short;
``Config.metrics`` gathers it with the rest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """The metrics endpoint, for Prometheus (``deploy/monitoring/`` on OpenShift)."""

    enabled: bool = False
    """Serve ``/metrics`` (OpenMetrics or Prometheus text, as the scraper asks). Default
    false: nothing listens and prometheus_client is not loaded (about 3 MiB)."""
    listen: str = "127.0.0.1:9448"
    """``address:port`` the endpoint binds. Default loopback, port 9448: the endpoint has no
    authentication of its own, so on OpenShift kube-rbac-proxy (deploy/monitoring/) listens
    on the node's address and forwards authorized scrapes here."""
