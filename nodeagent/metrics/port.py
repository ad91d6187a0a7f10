"""The ``Metrics`` port the features report to, and its no-op (metrics off).

Loaded by every daemon (the features hold a ``Metrics``); it imports nothing else of the
metrics package, so a daemon with metrics off carries only these two classes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from nodeagent.metrics.series import Transfer
    from nodeagent.releases import ReleaseRow
    from nodeagent.status import BundleReport, Condition, MirrorStatus, SetStatus


class Metrics(Protocol):
    """What the features report for the metrics endpoint. Every call is quick and never
    fails; with metrics off it does nothing (``NO_METRICS``)."""

    def sets_reported(self, sets: Sequence[SetStatus], *, is_final: bool) -> None: ...

    def pulls_sized(self, blobs: Mapping[str, Sequence[tuple[str, int]]]) -> None:
        """Per image about to be pulled, (digest, compressed size) of its blobs not stored."""

    def pull_ended(self, ref: str, *, is_pulled: bool, seconds: float | None) -> None: ...

    def admission_decided(
        self, admitted: Sequence[str], refused: Sequence[str], held: Sequence[str]
    ) -> None: ...

    def bundle_reported(self, report: BundleReport) -> None: ...

    def restore_ended(self, *, seconds: float) -> None:
        """A restore from the node store ended (its bytes come as ``transferred``)."""

    def transferred(self, kind: Transfer, size_bytes: int) -> None: ...

    def store_measured(self, size_bytes: int) -> None: ...

    def store_damaged(self, reason: str) -> None: ...

    def offline_checked(self, condition: Condition) -> None: ...

    def mirror_reported(self, mirror: MirrorStatus) -> None: ...

    def releases_reported(self, releases: Sequence[ReleaseRow]) -> None: ...

    def release_targets(self, targets: Mapping[str, str]) -> None: ...


class NoMetrics:
    """Metrics off: every report is dropped."""

    def sets_reported(self, sets: Sequence[SetStatus], *, is_final: bool) -> None:
        pass

    def pulls_sized(self, blobs: Mapping[str, Sequence[tuple[str, int]]]) -> None:
        pass

    def pull_ended(self, ref: str, *, is_pulled: bool, seconds: float | None) -> None:
        pass

    def admission_decided(
        self, admitted: Sequence[str], refused: Sequence[str], held: Sequence[str]
    ) -> None:
        pass

    def bundle_reported(self, report: BundleReport) -> None:
        pass

    def restore_ended(self, *, seconds: float) -> None:
        pass

    def transferred(self, kind: Transfer, size_bytes: int) -> None:
        pass

    def store_measured(self, size_bytes: int) -> None:
        pass

    def store_damaged(self, reason: str) -> None:
        pass

    def offline_checked(self, condition: Condition) -> None:
        pass

    def mirror_reported(self, mirror: MirrorStatus) -> None:
        pass

    def releases_reported(self, releases: Sequence[ReleaseRow]) -> None:
        pass

    def release_targets(self, targets: Mapping[str, str]) -> None:
        pass


NO_METRICS: Final[Metrics] = NoMetrics()
