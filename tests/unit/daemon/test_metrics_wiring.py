"""The composition root's metrics wiring: peers' served bytes reported as deltas, restores
timed, the recorder built only when metrics are on."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from nodeagent.config import Config, MetricsSettings
from nodeagent.daemon.wiring import LazyRestorer, build
from nodeagent.metrics import NO_METRICS
from nodeagent.metrics.recorder import Recorder
from nodeagent.metrics.series import Work
from nodeagent.prepull import PullResult


class Sent:
    """A ``ReportSender`` that keeps what it was given (or refuses, while ``is_down``)."""

    path = Path("/run/nodeagent/peer/reports.sock")

    def __init__(self) -> None:
        self.datagrams: list[bytes] = []
        self.is_down = False

    def send(self, data: bytes) -> bool:
        if self.is_down:
            return False
        self.datagrams.append(data)
        return True


def test_bytes_served_to_peers_are_reported_as_deltas_and_kept_while_not_taken() -> None:
    from nodeagent.daemon.site import Reporter

    sent = Sent()
    reporter = Reporter(cast(Any, sent))
    reporter.flush(1000)
    reporter.flush(0)  # nothing new: nothing sent
    sent.is_down = True
    reporter.flush(500)
    assert reporter.corrupt("sha256:" + "a" * 64) is False
    sent.is_down = False
    reporter.flush(0)  # the daemon is back: what it did not take is sent again
    assert sent.datagrams == [b"served 1000", b"served 500", b"corrupt sha256:" + b"a" * 64]


class Restorer:
    def __init__(self, results: Mapping[str, PullResult]) -> None:
        self.results = results

    async def holds(self, refs: Sequence[str]) -> list[str]:
        return list(refs)

    async def restore(self, refs: Sequence[str]) -> Mapping[str, PullResult]:
        return self.results


def built(restorer: Restorer) -> Callable[[], Any]:
    """The lazy restorer's factory: the stand-in, typed as what it stands for."""
    return lambda: restorer


async def test_a_restore_is_timed_only_when_it_restored_something(tmp_path: Path) -> None:
    recorder = Recorder()
    done = {"r.io/a@sha256:1": PullResult("r.io/a@sha256:1", True, 1, 2.0)}
    for restorer in (Restorer({}), Restorer(done)):
        lazy = LazyRestorer(tmp_path, built(restorer), recorder)
        assert await lazy.restore(["r.io/a@sha256:1"]) == restorer.results
    assert recorder.snapshot().durations[Work.RESTORE].count == 1


def test_the_recorder_is_built_only_with_metrics_on(tmp_path: Path) -> None:
    off = build(Config.default(tmp_path))
    assert off.recorder is None
    assert off.metrics is NO_METRICS
    on = build(replace(Config.default(tmp_path), metrics=MetricsSettings(enabled=True)))
    assert isinstance(on.recorder, Recorder)
    assert on.reporter.metrics is on.recorder
