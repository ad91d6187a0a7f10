"""The metrics endpoint of the real daemon, scraped while it pulls from the real registry into
the real CRI-O, and again once the set is pinned (docs/operations.md, "Metrics and alerts").

The registry is reached through the faulty proxy throttled to 1 MiB/s, so the 6 MiB pull
lasts long enough to be scraped in flight; the test waits on conditions, never on time.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Pushed
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.faulty_proxy import FaultyProxy
from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.registry import Registry, free_port
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.integration

MIB = 1024**2
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int, *, accept: str = "text/plain") -> tuple[str, Samples]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310  (loopback http)
        content_type = answer.headers["Content-Type"]
        text = answer.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return content_type, samples


def of_set(name: str, what: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (f"nodeagent_set_images_{what}", (("set", name),))


@pytest.mark.timeout(180)
def test_metrics_scraped_during_a_real_pull_and_after_the_pin(
    registry: Registry, tmp_path: Path
) -> None:
    image = TestImage("nodeagent-test/metrics", [LayerSpec(6 * MIB, seed=1846)]).build()
    pushed = push(registry.url, image.repository, image)
    port = free_port()
    started_unix_s = time.time()
    with (
        FaultyProxy(registry.host) as front,
        Crio(tmp_path / "crio", insecure_registries=[front.host]) as crio,
    ):
        front.throttle(1 * MIB)
        agent = Agent(
            tmp_path / "agent",
            crio,
            extra_config=f'\n[metrics]\nenabled = true\nlisten = "127.0.0.1:{port}"\n',
        )
        agent.write_config()
        with agent:
            agent.wait_log("metrics_served", timeout_s=60)
            _, idle = scrape(port)
            assert of_set("metrics", "wanted") not in idle  # no set yet: no set series
            agent.write_set("metrics", [pushed.reference(front.host)])

            def in_flight() -> Samples | None:
                _, now = scrape(port)
                status = agent.status() or {}
                is_pulling = set_state(status, "metrics") == "Progressing"
                return now if is_pulling and now.get(of_set("metrics", "wanted")) == 1 else None

            during = wait_for(in_flight, timeout_s=60, interval_s=0.1, what="a scrape mid-pull")
            assert during[of_set("metrics", "pinned")] == 0
            assert during[("nodeagent_pull_duration_seconds_count", ())] == 0
            admitted = ("nodeagent_disk_admission_decisions_total",
                        (("decision", "admitted"), ("reason", "Admitted")))  # fmt: skip
            assert during[admitted] == 1
            assert during[("nodeagent_disk_refused_sets", ())] == 0
            # The pull is still running: the proxy has not relayed the whole layer yet.
            assert front.body_bytes() < pushed.total_size_bytes

            agent.wait_status(lambda s: set_state(s, "metrics") == "Pinned", what="pinned")

            def after_pin() -> tuple[str, Samples] | None:
                content_type, now = scrape(port, accept="application/openmetrics-text")
                is_synced = ("nodeagent_last_sync_timestamp_seconds", ()) in now
                is_pinned = now.get(of_set("metrics", "pinned")) == 1
                return (content_type, now) if is_synced and is_pinned else None

            content_type, after = wait_for(after_pin, timeout_s=30, what="a scrape after the pin")
    assert content_type.startswith("application/openmetrics-text")
    assert after[of_set("metrics", "wanted")] == after[of_set("metrics", "pinned")] == 1
    assert after[of_set("metrics", "failed")] == 0
    assert after[("nodeagent_set_generation", (("set", "metrics"),))] >= 1
    # Every blob of the image came over the wire (CRI-O's store was empty): config + layer.
    pulled = after[("nodeagent_transferred_bytes_total", (("kind", "pulled"),))]
    assert pulled == pushed.total_size_bytes > 6 * MIB
    assert after[("nodeagent_pull_duration_seconds_count", ())] == 1
    # 6 MiB at 1 MiB/s: more than 5 s (the +Inf bucket holds it, the 1 s bucket does not).
    assert after[("nodeagent_pull_duration_seconds_bucket", (("le", "1.0"),))] == 0
    assert after[("nodeagent_pull_duration_seconds_sum", ())] > 5.0
    assert after[("nodeagent_last_sync_timestamp_seconds", ())] >= started_unix_s
    assert "metrics_served" in agent.log_text()


@pytest.mark.timeout(120)
def test_a_taken_port_leaves_pinning_alone_and_says_so_once(
    crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = Agent(
            tmp_path / "agent",
            crio,
            extra_config=f'\n[metrics]\nenabled = true\nlisten = "127.0.0.1:{port}"\n',
        )
        agent.write_config()
        agent.write_set("apps", [pushed.ref(pushed.base_a)])
        with agent:
            agent.wait_status(lambda s: set_state(s, "apps") == "Pinned", what="pinned")
            wait_for(  # failed, restarted after 1 s, failed again
                lambda: agent.log_text().count("optional_task_failed") >= 2,
                timeout_s=30,
                what="the metrics task failed twice",
            )
            log = agent.log_text()
    assert log.count("metrics_not_served") == 1
    assert "reason=MetricsListenFailed" in log
    assert f"127.0.0.1:{port}" in log


@pytest.mark.timeout(180)
def test_images_restored_from_the_node_store_are_counted_as_restored_not_pulled(
    fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    """``[store] registry_sets``: nodeagent fetches the image into the store (bytes pulled
    from the registry), then the runtime pulls it from the store's loopback mirror: a
    restore, with its bytes and its time, not a second pull."""
    port = free_port()
    agent = Agent(
        tmp_path / "agent",
        fresh_crio,
        extra_config=(
            "[store]\nregistry_sets = true\n"
            f'\n[metrics]\nenabled = true\nlisten = "127.0.0.1:{port}"\n'
        ),
    )
    agent.write_config()
    image = pushed.base_b
    agent.write_set("stored", [pushed.ref(image)])
    with agent:
        agent.wait_status(lambda s: set_state(s, "stored") == "Pinned", what="pinned")

        def restored() -> Samples | None:
            _, now = scrape(port)
            is_counted = now.get(("nodeagent_restore_duration_seconds_count", ())) == 1
            return now if is_counted and now.get(of_set("stored", "pinned")) == 1 else None

        after = wait_for(restored, timeout_s=30, what="the restore counted")
    moved = {kind: after[("nodeagent_transferred_bytes_total", (("kind", kind),))]
             for kind in ("pulled", "restored")}  # fmt: skip
    # The registry's bytes came once, into the store: the image, its manifest besides.
    size = image.total_size_bytes
    print(f"pulled {moved['pulled']} B, restored {moved['restored']} B, image {size} B")
    assert size <= moved["pulled"] <= size + (64 << 10)
    # The runtime read at least the image's config and layers from the store's mirror.
    assert moved["restored"] >= image.total_size_bytes
