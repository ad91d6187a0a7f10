"""The metrics endpoint as a daemon task (``[metrics] enabled = true``; docs/operations.md).

Loaded only when metrics are on: it imports prometheus_client (``adapters.metrics``). The
task is optional: if the address cannot be bound (``MetricsListenFailed``) the supervisor
restarts it with backoff and pinning goes on; the journal says so once
(``metrics_not_served``, with its catalog entry).
"""

from __future__ import annotations

import asyncio

import structlog

from nodeagent.adapters.metrics import MetricsEndpoint
from nodeagent.config.addresses import parse_address
from nodeagent.errors import MetricsListenFailed
from nodeagent.metrics.recorder import Recorder

log = structlog.get_logger(__name__)


class MetricsTask:
    """Serves ``recorder`` on ``listen`` until cancelled; says a bind failure once."""

    def __init__(self, recorder: Recorder, listen: str) -> None:
        self.recorder = recorder
        self.address = parse_address(listen)  # checked when the configuration was loaded
        self._is_failing = False

    async def run(self) -> None:
        endpoint = MetricsEndpoint(self.recorder, host=self.address.host, port=self.address.port)
        try:
            async with endpoint:
                event = "metrics_served_again" if self._is_failing else "metrics_served"
                log.info(event, address=str(self.address))
                self._is_failing = False
                await asyncio.Event().wait()  # until cancelled (the daemon stops)
        except MetricsListenFailed as exc:
            if not self._is_failing:  # a transition, said once; the supervisor logs each retry
                log.error(
                    "metrics_not_served",
                    address=str(self.address),
                    reason=exc.reason,
                    error=exc.message,
                )
            self._is_failing = True
            raise
