"""Contract of the CVO stand-in (tests/testenv/cvo.py) on the real kube-apiserver.

With openshift/api's ClusterVersion CRD, every status the stand-in writes must pass the API
server's schema (required fields, a null ``completionTime``), and read back through
``nodeagent.cluster.clusterversion`` as the CVO means it: installed → Completed; a desired
update → a Partial entry first and the previous one's completion time set; complete →
Completed; a failure → Failing with the entry still Partial; the history bounded.
About 3 s with the API server running.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nodeagent.cluster.clusterversion import COMPLETED, PARTIAL, parse_cluster_version
from tests.testenv.cvo import MAX_HISTORY, CvoStandIn, Target, install_crd, release_image
from tests.testenv.kube import KubeCluster

pytestmark = pytest.mark.integration

OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64
NEXT = "sha256:" + "c" * 64


@pytest.fixture(scope="module")
def cvo(kube: KubeCluster) -> Iterator[CvoStandIn]:
    install_crd(kube)
    yield CvoStandIn(kube)
    kube.kubectl("delete", "clusterversion", "version", "--ignore-not-found")


def test_an_installed_cluster_has_one_completed_release(cvo: CvoStandIn) -> None:
    cvo.install("4.16.3", release_image(OLD), channel="eus-4.16")
    view = parse_cluster_version(cvo.get())
    assert view.is_usable, view.problems
    assert view.current is not None and (view.current.version, view.current.digest) == (
        "4.16.3",
        OLD,
    )
    assert not view.is_updating and view.target_digests() == frozenset()
    assert view.is_condition_true("Available") and not view.is_condition_true("Progressing")
    assert view.channel == "eus-4.16"


def test_an_update_runs_partial_then_completes(cvo: CvoStandIn) -> None:
    cvo.install("4.16.3", release_image(OLD))
    cvo.kube.kubectl_ok(
        "patch", "clusterversion", "version", "--type=merge",
        "-p", f'{{"spec":{{"desiredUpdate":{{"image":"{release_image(NEW)}"}}}}}}',
    )  # fmt: skip
    assert parse_cluster_version(cvo.get()).target_digests() == {NEW}
    assert cvo.reconcile("4.16.5") is not None
    assert cvo.reconcile("4.16.5") is None  # the same target again: nothing to do

    running = parse_cluster_version(cvo.get())
    assert running.is_usable, running.problems
    assert [e.state for e in running.history] == [PARTIAL, COMPLETED]
    assert running.history[0].completion_time is None
    assert running.current is not None and running.current.version == "4.16.3"
    assert running.is_updating and running.is_condition_true("Progressing")
    assert running.desired is not None and running.desired.digest == NEW
    assert running.observed_generation == running.generation

    cvo.complete()
    done = parse_cluster_version(cvo.get())
    assert [e.state for e in done.history] == [COMPLETED, COMPLETED]
    assert done.history[0].completion_time is not None
    assert done.current is not None and done.current.version == "4.16.5"
    assert not done.is_updating and not done.is_condition_true("Progressing")
    assert done.target_digests() == {NEW}  # desiredUpdate still names it; it is current
    assert done.current.digest == NEW


def test_a_second_update_before_the_first_completed(cvo: CvoStandIn) -> None:
    cvo.install("4.16.3", release_image(OLD))
    cvo.begin(Target("4.16.5", release_image(NEW)))
    cvo.fail("ClusterOperatorDegraded", "Cluster operator etcd is degraded")
    failing = parse_cluster_version(cvo.get())
    assert failing.is_condition_true("Failing") and failing.history[0].state == PARTIAL

    cvo.begin(Target("4.16.6", release_image(NEXT)))
    view = parse_cluster_version(cvo.get())
    assert [(e.state, e.release.version) for e in view.history] == [
        (PARTIAL, "4.16.6"),
        (PARTIAL, "4.16.5"),  # never completed: stays Partial, with a completion time
        (COMPLETED, "4.16.3"),
    ]
    assert view.history[1].completion_time is not None
    assert view.current is not None and view.current.version == "4.16.3"
    assert view.target_digests() == {NEXT}


def test_the_history_is_bounded(cvo: CvoStandIn) -> None:
    cvo.install("4.16.0", release_image(OLD))
    status = cvo.get()["status"]
    entry = status["history"][0]
    status["history"] = [dict(entry, version=f"4.16.{i}") for i in range(MAX_HISTORY)]
    cvo.write_status(status)
    cvo.begin(Target("4.17.0", release_image(NEW)))
    view = parse_cluster_version(cvo.get())
    assert len(view.history) == MAX_HISTORY
    assert view.history[0].release.version == "4.17.0"


def test_the_schema_refuses_what_the_cvo_never_writes(cvo: CvoStandIn) -> None:
    """The stand-in's writes pass because they are right, not because nothing is checked."""
    cvo.install("4.16.3", release_image(OLD))
    status = cvo.get()["status"]
    del status["history"][0]["startedTime"]
    with pytest.raises(RuntimeError, match="startedTime"):
        cvo.write_status(status)
