"""The composition root's metrics wiring: peers' served bytes counted as deltas, restores
timed, the recorder built only when metrics are on."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from nodeagent.config import Config, MetricsSettings
from nodeagent.daemon.wiring import LazyRestorer, build
from nodeagent.metrics import NO_METRICS
from nodeagent.metrics.recorder import Recorder
from nodeagent.metrics.series import Transfer, Work
from nodeagent.prepull import PullResult


@dataclass
class Counters:
    bytes_served: int = 0


@dataclass
class Server:
    counters: Counters = field(default_factory=Counters)


def test_bytes_served_to_peers_are_added_as_deltas() -> None:
    from nodeagent.daemon.site import _count_served

    recorder, server = Recorder(), Server()
    peer_server = cast(Any, server)
    server.counters.bytes_served = 1000
    counted = _count_served(peer_server, recorder, 0)
    server.counters.bytes_served = 1500
    counted = _count_served(peer_server, recorder, counted)
    counted = _count_served(peer_server, recorder, counted)  # nothing new: nothing added
    assert counted == 1500
    assert recorder.snapshot().transferred_bytes[Transfer.SERVED] == 1500


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
