"""The daemon's drill: the checks every ``interval_s`` and after each change, published.

``OfflineDrill.run`` gathers the facts (``FactSource``), runs ``checks.CHECKS`` and hands
the ``OfflineReady`` condition to the status publisher (``ConditionSink``). A change of
readiness (or of the reasons) is logged once: ``offline_not_ready`` (a warning with a
journal catalog entry) or ``offline_ready``. In cluster mode each pod that pulls
``Always`` gets one warning Event (``PodWarnings``), once per pod uid, not once per run.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Sequence
from typing import Final, Protocol

import structlog

from nodeagent.errors import NodeAgentError
from nodeagent.offline import findings as f
from nodeagent.offline.checks import CHECKS, Check, run_checks
from nodeagent.offline.facts import FactSource
from nodeagent.offline.findings import OfflineReport, PodRef, finding, report_of
from nodeagent.status import Condition

log = structlog.get_logger(__name__)

MAX_WARNED_PODS: Final = 10_000
"""Pod uids remembered as warned; the oldest is forgotten beyond (it warns again, once)."""
EVENT_REASON: Final = "ImagePullPolicyAlways"


class ConditionSink(Protocol):
    """Takes the ``OfflineReady`` condition into every status published (``reporting``)."""

    def offline_checked(self, condition: Condition) -> None: ...


class PodWarnings(Protocol):
    """Creates a warning Event about one pod (``adapters.offline.KubePodWarnings``)."""

    async def warn(self, pod: PodRef, reason: str, message: str) -> None: ...


class OfflineDrill:
    def __init__(
        self,
        facts: FactSource,
        sink: ConditionSink,
        *,
        interval_s: float,
        warnings: PodWarnings | None = None,
        checks: Sequence[tuple[str, Check]] = CHECKS,
        changed: asyncio.Event | None = None,
    ) -> None:
        """``changed``: set by whoever knows of a change (the reporter after each sync)."""
        self.facts = facts
        self.sink = sink
        self.interval_s = interval_s
        self.warnings = warnings
        self.checks = checks
        self.changed = changed or asyncio.Event()
        self.last: OfflineReport | None = None
        self.warned: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.runs = 0

    def request(self) -> None:
        """Run again soon: a sync finished, a bundle was imported."""
        self.changed.set()

    async def run(self) -> None:
        # The first look waits for the first sync to finish (or one interval): at boot the
        # runtime may not answer yet, which is no finding for a technician to chase.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.interval_s):
                await self.changed.wait()
        while True:
            self.changed.clear()
            await self.run_once()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self.changed.wait()

    async def run_once(self) -> OfflineReport:
        try:
            facts = await self.facts.gather()
            report = run_checks(facts, self.checks)
        except NodeAgentError as exc:
            report = report_of(
                [name for name, _ in self.checks],
                [finding(f.CHECK_INCOMPLETE, f"{exc.reason}: {exc.message}", "see the reason")],
            )
        self.runs += 1
        self._log(report)
        self.last = report
        self.sink.offline_checked(report.condition())
        await self._warn(report)
        return report

    def _log(self, report: OfflineReport) -> None:
        before = self.last
        if before is not None and before.reasons() == report.reasons():
            return
        if report.is_ready:
            log.info("offline_ready", checks=len(report.checks))
            return
        first = report.findings[0]
        log.warning(
            "offline_not_ready",
            reason=first.reason,
            findings=len(report.findings),
            reasons=",".join(report.reasons()),
            error=first.message,
            image=first.subject or None,
        )

    async def _warn(self, report: OfflineReport) -> None:
        if self.warnings is None:
            return
        for item in report.findings:
            pod = item.pod
            if item.reason != f.POD_PULLS_ALWAYS or pod is None or not pod.uid:
                continue
            if pod.uid in self.warned:
                continue
            try:
                await self.warnings.warn(pod, EVENT_REASON, item.message)
            except NodeAgentError as exc:  # the next run tries again
                log.warning("pod_warning_not_sent", reason=exc.reason, error=exc.message)
                return
            self.warned[pod.uid] = None
            while len(self.warned) > MAX_WARNED_PODS:
                self.warned.popitem(last=False)
