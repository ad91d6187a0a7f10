"""The daemon's drill in process: condition published, journal once per change, one Event
per pod uid, a failed Event tried again at the next run."""

from __future__ import annotations

import asyncio
import dataclasses

from structlog.testing import capture_logs

from nodeagent.errors import ApiUnreachable, RuntimeUnreachable
from nodeagent.offline import findings as f
from nodeagent.offline.drill import OfflineDrill
from nodeagent.offline.facts import Facts, PodImage
from nodeagent.offline.findings import PodRef
from nodeagent.status import Condition


class Sink:
    def __init__(self) -> None:
        self.conditions: list[Condition] = []

    def offline_checked(self, condition: Condition) -> None:
        self.conditions.append(condition)


class Facts_:
    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self.error: Exception | None = None

    async def gather(self) -> Facts:
        if self.error is not None:
            raise self.error
        return self.facts


class Warnings:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.failing = False

    async def warn(self, pod: PodRef, reason: str, message: str) -> None:
        if self.failing:
            raise ApiUnreachable("no answer")
        self.sent.append(f"{pod.uid}:{reason}")


def always(uid: str) -> PodImage:
    ref = "q.example.com/a@sha256:" + "a" * 64
    return PodImage(PodRef("ns", f"pod-{uid}", uid), "c", ref, "Always", "api")


async def test_events_once_per_pod_uid_and_retried_after_a_failure() -> None:
    source = Facts_(Facts(pods=(always("u1"),)))
    sink, warnings = Sink(), Warnings()
    drill = OfflineDrill(source, sink, interval_s=600, warnings=warnings)
    await drill.run_once()
    await drill.run_once()
    assert warnings.sent == ["u1:ImagePullPolicyAlways"]
    warnings.failing = True
    source.facts = Facts(pods=(always("u1"), always("u2")))
    await drill.run_once()
    warnings.failing = False
    await drill.run_once()
    assert warnings.sent == ["u1:ImagePullPolicyAlways", "u2:ImagePullPolicyAlways"]
    assert [c.reason for c in sink.conditions] == [f.POD_PULLS_ALWAYS] * 4


async def test_a_gather_failure_is_a_false_condition_and_recovery_is_true() -> None:
    source = Facts_(Facts())
    source.error = RuntimeUnreachable("socket gone")
    sink = Sink()
    drill = OfflineDrill(source, sink, interval_s=600)
    report = await drill.run_once()
    assert not report.is_ready and sink.conditions[-1].reason == f.CHECK_INCOMPLETE
    source.error = None
    await drill.run_once()
    assert sink.conditions[-1].is_true


class QueueSink:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[Condition] = asyncio.Queue()

    def offline_checked(self, condition: Condition) -> None:
        self.queue.put_nowait(condition)


async def test_run_waits_for_the_first_sync_then_for_each_request() -> None:
    source = Facts_(Facts())
    sink = QueueSink()
    changed = asyncio.Event()
    drill = OfflineDrill(source, sink, interval_s=3600, changed=changed)
    task = asyncio.create_task(drill.run())
    try:
        async with asyncio.timeout(10):
            await asyncio.sleep(0)  # the task runs up to its first wait
            assert drill.runs == 0 and sink.queue.empty()  # at boot: no look before a sync
            changed.set()  # the first sync finished
            assert (await sink.queue.get()).is_true
            source.facts = dataclasses.replace(source.facts, pods=(always("u9"),))
            changed.set()
            assert (await sink.queue.get()).reason == f.POD_PULLS_ALWAYS
    finally:
        task.cancel()
    assert drill.runs == 2


async def test_the_journal_says_each_change_once() -> None:
    source = Facts_(Facts(pods=(always("u1"),)))
    drill = OfflineDrill(source, Sink(), interval_s=600)
    with capture_logs() as logs:
        await drill.run_once()
        await drill.run_once()
        source.facts = Facts()
        await drill.run_once()
        await drill.run_once()
    events = [(e["event"], e.get("reason")) for e in logs if e["event"].startswith("offline_")]
    assert events == [("offline_not_ready", f.POD_PULLS_ALWAYS), ("offline_ready", None)]
