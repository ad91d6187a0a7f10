"""The OpenMetrics endpoint: the recorder's snapshot in prometheus_client's exposition.

``MetricsEndpoint`` serves ``/metrics`` on the daemon's event loop (asyncio streams, no
thread, nothing woken between scrapes): each connection gets one answer and is closed. The
body is prometheus_client's exposition (``choose_encoder``: OpenMetrics when the scraper's
``Accept`` header asks for it, Prometheus text otherwise; gzip when ``Accept-Encoding``
allows it). The request's head is read within ``HEAD_TIMEOUT_S`` and parsed strictly
(``strict.http.parse_request_head``: 400 otherwise); ``GET`` and ``HEAD`` of ``/metrics``
only (404, 405); at most ``MAX_CONNECTIONS`` at once (more are closed unanswered). Each
scrape reads ``Recorder.snapshot()`` (one lock, held only while a number is added, never
across an await): a scrape never waits on a sync. A wedged event loop stops answering,
which the scraper sees as the target down (docs/decisions/0078).

Imported only when ``[metrics] enabled`` (prometheus_client is loaded here alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from nodeagent.errors import MetricsListenFailed
from nodeagent.metrics.series import Histogram, Snapshot, Transfer, Work
from nodeagent.strict import MalformedInput
from nodeagent.strict.http import MAX_HEAD_BYTES, RequestHead, parse_request_head

if TYPE_CHECKING:
    from nodeagent.metrics.recorder import Recorder

HEAD_TIMEOUT_S: Final = 10.0
"""A scraper sends its request at once; a connection still silent after this is closed."""
WRITE_TIMEOUT_S: Final = 30.0
"""An answer the scraper does not take within this is dropped with its connection."""
MAX_CONNECTIONS: Final = 16
"""Connections served at once; Prometheus opens one per scrape."""
PATH: Final = "/metrics"

PREFIX = "nodeagent_"


class SnapshotCollector(Collector):
    """Every ``nodeagent_`` family, from one snapshot of the recorder per scrape."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def collect(self) -> Iterator[Metric]:
        now = self.recorder.snapshot()
        yield from set_families(now)
        yield from transfer_families(now)
        yield from decision_families(now)
        yield from node_families(now)
        yield from mirror_families(now)
        yield from release_families(now)


def set_families(now: Snapshot) -> Iterator[Metric]:
    if not now.sets_reported:
        return
    gauges = {
        "wanted": "Images the set names (its PinnedImageSet's spec)",
        "present": "Images of the set the runtime holds",
        "pinned": "Images of the set pinned in the runtime",
        "failed": "Images of the set whose pull or restore failed",
    }
    for field, help_text in gauges.items():
        family = GaugeMetricFamily(f"{PREFIX}set_images_{field}", help_text, labels=["set"])
        for row in now.sets:
            family.add_metric([row.name], getattr(row, field))
        yield family
    generation = GaugeMetricFamily(
        f"{PREFIX}set_generation", "Generation of the set's spec last synced", labels=["set"]
    )
    for row in now.sets:
        if row.generation is not None:
            generation.add_metric([row.name], row.generation)
    yield generation


def transfer_families(now: Snapshot) -> Iterator[Metric]:
    moved = CounterMetricFamily(
        f"{PREFIX}transferred_bytes",
        "Bytes moved, by kind: pulled (compressed, from registries), imported (bundles), "
        "restored (from the node store), served to and fetched from peers",
        labels=["kind"],
    )
    for kind in Transfer:
        moved.add_metric([kind.value], now.transferred_bytes.get(kind, 0))
    yield moved
    for work in Work:
        yield histogram(work, now.durations.get(work, Histogram()))


def histogram(work: Work, observed: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(
        f"{PREFIX}{work.value}_duration_seconds",
        f"Seconds each {work.value} took (an image's pull from its first attempt, a bundle's "
        "import from its detection, a restore from the node store)",
        buckets=observed.cumulative(),
        sum_value=observed.total,
    )


def decision_families(now: Snapshot) -> Iterator[Metric]:
    bundles = CounterMetricFamily(
        f"{PREFIX}bundles",
        "Bundles ended, by outcome and reason code",
        labels=["outcome", "reason"],
    )
    for (outcome, reason), count in sorted(now.bundles.items()):
        bundles.add_metric([outcome, reason], count)
    yield bundles
    admissions = CounterMetricFamily(
        f"{PREFIX}disk_admission_decisions",
        "Disk admission's decisions per set and sync, by decision and reason code",
        labels=["decision", "reason"],
    )
    for (decision, reason), count in sorted(now.admissions.items()):
        admissions.add_metric([decision, reason], count)
    yield admissions
    if now.refused_sets is not None:
        yield GaugeMetricFamily(
            f"{PREFIX}disk_refused_sets",
            "Sets the last disk admission refused for lack of space",
            value=now.refused_sets,
        )
    damaged = CounterMetricFamily(
        f"{PREFIX}store_damaged",
        "Damaged blobs or records found in the node's store, by reason code",
        labels=["reason"],
    )
    for reason, count in sorted(now.store_corruptions.items()):
        damaged.add_metric([reason], count)
    yield damaged
    yield CounterMetricFamily(
        f"{PREFIX}metrics_labels_folded",
        "Reports counted under reason 'Other' because their counter had 64 reasons",
        value=now.labels_dropped,
    )


def node_families(now: Snapshot) -> Iterator[Metric]:
    if now.store_size_bytes is not None:
        yield GaugeMetricFamily(
            f"{PREFIX}store_size_bytes", "Bytes the node's store holds", value=now.store_size_bytes
        )
    if now.last_sync_unix_s is not None:
        yield GaugeMetricFamily(
            f"{PREFIX}last_sync_timestamp_seconds",
            "When the last sync ended (Unix seconds)",
            value=now.last_sync_unix_s,
        )
    yield GaugeMetricFamily(
        f"{PREFIX}offline_ready_known",
        "1 once the offline drill has run (only then is nodeagent_offline_ready exported)",
        value=int(now.offline_ready is not None),
    )
    if now.offline_ready is not None:
        yield GaugeMetricFamily(
            f"{PREFIX}offline_ready",
            "1 if the node would keep running with its registries gone (the offline drill)",
            value=int(now.offline_ready),
        )


def mirror_families(now: Snapshot) -> Iterator[Metric]:
    """The node mirror (docs/mirror.md), once the peer process has reported it; its counts
    are the peer process's since it started (a restart resets them, as counters may)."""
    mirror = now.mirror
    if mirror is None:
        return
    yield GaugeMetricFamily(
        f"{PREFIX}node_mirror_serving",
        "1 while the node mirror serves on loopback (as the peer process last reported)",
        value=int(mirror.serving),
    )
    blobs = GaugeMetricFamily(
        f"{PREFIX}node_mirror_blobs",
        "Blobs the node mirror serves: bundle content (any local client), registry-set "
        "content (only with the mirror's credential)",
        labels=["content"],
    )
    blobs.add_metric(["bundle"], mirror.blobs)
    blobs.add_metric(["registry"], mirror.registry_blobs)
    yield blobs
    for name, value, text in (
        ("requests", mirror.requests, "Requests the node mirror answered"),
        ("missing", mirror.missing, "Manifests and blobs asked of the node mirror not held"),
        ("denied", mirror.denied, "Registry-set content asked for without the credential"),
    ):
        yield CounterMetricFamily(f"{PREFIX}node_mirror_{name}", text, value=value)


def release_families(now: Snapshot) -> Iterator[Metric]:
    """The releases the node holds and those ClusterVersion asks for (docs/upgrade.md)."""
    pinned = GaugeMetricFamily(
        f"{PREFIX}release_pinned",
        "1 if the node has pinned the OpenShift release (its set), 0 if it holds it unpinned; "
        "upgrade: it upgrades the cluster's version",
        labels=["version", "digest", "upgrade"],
    )
    for release in now.releases:
        labels = [release.version, release.digest, str(release.is_upgrade).lower()]
        pinned.add_metric(labels, int(release.is_pinned))
    yield pinned
    targets = GaugeMetricFamily(
        f"{PREFIX}release_target",
        "1 for each release ClusterVersion asks the cluster to move to (its desired update)",
        labels=["version", "digest"],
    )
    for digest, version in sorted(now.release_targets.items()):
        targets.add_metric([version, digest], 1)
    yield targets


class MetricsEndpoint:
    """``async with MetricsEndpoint(recorder, host, port):`` serves /metrics until exited."""

    def __init__(self, recorder: Recorder, *, host: str, port: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(recorder))
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> MetricsEndpoint:
        try:
            self._server = await asyncio.start_server(
                self._serve, self.host, self.port, limit=MAX_HEAD_BYTES, reuse_address=True
            )
        except OSError as exc:
            raise MetricsListenFailed(
                f"cannot listen on {self.host}:{self.port} for metrics: {exc.strerror or exc}; "
                "free the port or set [metrics] listen to another address:port"
            ) from exc
        return self

    @property
    def bound_port(self) -> int:
        """The port listened on (the one asked for, or the kernel's choice for port 0)."""
        if self._server is None:
            raise RuntimeError("the endpoint is not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in self._open:  # their handlers end at their next read or write
            writer.close()
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            if len(self._open) <= MAX_CONNECTIONS:
                await self._answer(reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the scraper went away or stayed silent: nothing to answer, nothing to log
        finally:
            self._open.discard(writer)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            writer.write(answer_bytes(431, "request header fields too large\n"))
        else:
            try:
                request = parse_request_head(head)
            except MalformedInput as exc:
                writer.write(answer_bytes(400, f"bad request: {exc}\n"))
            else:
                writer.write(self.answer(request))
        async with asyncio.timeout(WRITE_TIMEOUT_S):
            await writer.drain()

    def answer(self, request: RequestHead) -> bytes:
        """The whole response to ``request`` (one snapshot of the recorder when it is a scrape)."""
        if request.path != PATH:
            return answer_bytes(404, f"not found; the metrics are at {PATH}\n")
        if request.method not in ("GET", "HEAD"):
            return answer_bytes(405, "method not allowed\n", extra=(("Allow", "GET, HEAD"),))
        encoder, content_type = choose_encoder(request.fields.get("accept", ""))
        body = encoder(self.registry)
        extra: tuple[tuple[str, str], ...] = ()
        if gzip_accepted(request.fields.get("accept-encoding", "")):
            body = gzip.compress(body, mtime=0)
            extra = (("Content-Encoding", "gzip"),)
        return answer_bytes(
            200, body, content_type=content_type, extra=extra, head_only=request.method == "HEAD"
        )


def answer_bytes(
    status: int,
    body: str | bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: tuple[tuple[str, str], ...] = (),
    head_only: bool = False,
) -> bytes:
    """An HTTP/1.1 response that closes its connection."""
    data = body.encode() if isinstance(body, str) else body
    lines = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(data)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in extra),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (b"" if head_only else data)


_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
}
