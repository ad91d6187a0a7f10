"""Expired watches (410) against a real kube-apiserver whose etcd history is compacted.

The session's API server serves watches from its watch cache, which replays recent events
from memory even after etcd compacted them, so no watch there ever expires within a test.
This module starts a cluster of its own with:

* ``--watch-cache=false``: every watch is an etcd watch, and a watch from a compacted
  resourceVersion fails as it does on any API server once the version left its window
  (the API server answers HTTP 200, then one ERROR event: Status 410, reason Expired);
* ``--min-request-timeout=1``: the API server ends each watch cleanly after 1 to 2 s (in a
  cluster: 30 to 60 min), after which lightkube resumes it from the last version it saw;
* an audit log of the LIST and WATCH requests for PinnedImageSets and Nodes, so a test can
  see which requests nodeagent made and from which resourceVersion.

etcd is compacted through its v3 JSON gateway (``KubeCluster.compact_etcd``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import json
import ssl
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import structlog.testing
from lightkube.core.exceptions import ApiError

from nodeagent.adapters.files import mirror_directory
from nodeagent.adapters.kube import Gone, KubeApi
from nodeagent.cluster import kinds
from nodeagent.cluster.api import Obj
from nodeagent.cluster.tasks import ClusterSpecs, Connection
from nodeagent.config import ClusterSettings, Config
from nodeagent.errors import ApiRequestRejected
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import apply, install_deploy, pinned_image_set
from tests.testenv.waiting import WaitTimeout, wait_for_async

# The first test starts this module's own etcd and kube-apiserver (``expiring``).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SETS = "pinnedimagesets"
SETS_PATH = "/apis/machineconfiguration.openshift.io/v1/pinnedimagesets"
REF = "registry.example.com/nodeagent-test/app@sha256:" + "ab" * 32
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["list", "watch"]
    resources:
      - group: machineconfiguration.openshift.io
        resources: ["pinnedimagesets"]
      - group: ""
        resources: ["nodes"]
"""


@dataclasses.dataclass
class Request:
    """One LIST or WATCH the audit log recorded: its verb, resourceVersion and whether it ended."""

    verb: str
    version: str
    is_complete: bool = False


class ExpiringKube:
    """The module's cluster and its audit log."""

    def __init__(self, cluster: KubeCluster, audit_log: Path) -> None:
        self.cluster = cluster
        self.audit_log = audit_log

    def requests(self, user: str, resource: str = SETS) -> list[Request]:
        """The LISTs and WATCHes ``user`` made on ``resource``, in the order they started."""
        try:
            text = self.audit_log.read_text()
        except FileNotFoundError:
            return []
        found: dict[str, Request] = {}
        for line in text[: text.rfind("\n") + 1].splitlines():  # a line being written waits
            event = json.loads(line)
            if event["user"]["username"] != user or event["objectRef"]["resource"] != resource:
                continue
            query = parse_qs(urlsplit(event["requestURI"]).query)
            request = found.setdefault(
                event["auditID"], Request(event["verb"], query.get("resourceVersion", [""])[0])
            )
            if event["stage"] == "ResponseComplete":
                request.is_complete = True
        return list(found.values())

    def bump_and_compact(self) -> int:
        """Write twice, then compact etcd up to now: every version a client saw before is then
        expired (a watch from version v starts at revision v + 1, which must be compacted)."""
        name = f"bump-{uuid.uuid4().hex[:8]}"
        self.cluster.kubectl_ok("create", "configmap", name)
        self.cluster.kubectl_ok("delete", "configmap", name)
        return self.cluster.compact_etcd()


@pytest.fixture(scope="module")
def expiring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExpiringKube]:
    base = tmp_path_factory.mktemp("kube-expiring")
    policy = base / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    audit_log = base / "audit.log"
    extra = (
        "--watch-cache=false",
        "--min-request-timeout=1",
        f"--audit-policy-file={policy}",
        f"--audit-log-path={audit_log}",
        "--audit-log-mode=blocking",
    )
    with KubeCluster(base / "kube", extra_args=extra) as cluster:
        install_deploy(cluster)
        yield ExpiringKube(cluster, audit_log)


def names(snapshot: dict[str, Obj], prefix: str) -> set[str]:
    return {name for name in snapshot if name.startswith(prefix)}


async def wait_requests(
    expiring: ExpiringKube, user: str, check: Any, *, what: str, resource: str = SETS
) -> list[Request]:
    async def probe() -> list[Request] | None:
        found = expiring.requests(user, resource)
        return found if check(found) else None

    try:
        return await wait_for_async(probe, timeout_s=30, what=what)
    except WaitTimeout as exc:
        made = expiring.requests(user, resource)
        raise WaitTimeout(f"{exc}; requests so far: {made}") from exc


@dataclasses.dataclass
class NodeClient:
    api: KubeApi
    node: str

    @property
    def user(self) -> str:
        return f"system:node:{self.node}"


@pytest.fixture
async def client(
    expiring: ExpiringKube, request: pytest.FixtureRequest
) -> AsyncIterator[NodeClient]:
    """A KubeApi with a kubelet's identity (``system:node:<test name>``), as nodeagent has."""
    node = request.node.name.removeprefix("test_").replace("_", "-")[:40].rstrip("-")
    kubeconfig = expiring.cluster.kubeconfig_for_node(node)
    api = KubeApi(kubeconfig, timeout_s=10, field_manager="nodeagent")
    yield NodeClient(api, node)
    await api.close()


# ------------------------------------------------------------------ the server, then the adapter


def raw_watch_first_event(cluster: KubeCluster, version: str) -> tuple[int, dict[str, Any]]:
    """GET a watch from ``version`` over plain HTTPS; the status and the first event."""
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    cert, key = cluster.client_certificate("watch-probe", ["system:masters"])
    context.load_cert_chain(str(cert), str(key))
    conn = http.client.HTTPSConnection("127.0.0.1", cluster.port, timeout=10, context=context)
    try:
        conn.request("GET", f"{SETS_PATH}?watch=1&resourceVersion={version}")
        response = conn.getresponse()
        event: dict[str, Any] = json.loads(response.readline())
        return response.status, event
    finally:
        conn.close()


async def test_a_watch_from_a_compacted_version_raises_gone(
    expiring: ExpiringKube, client: NodeClient
) -> None:
    cluster, node_api = expiring.cluster, client.api
    apply(cluster, pinned_image_set("expired-a", [REF]))
    _, listed = await node_api.list(kinds.PINNED_IMAGE_SET)
    apply(cluster, pinned_image_set("expired-b", [REF]))
    compacted = expiring.bump_and_compact()
    assert int(listed) + 1 < compacted

    # What the server says: HTTP 200, then an ERROR event carrying Status 410 Expired.
    status, event = raw_watch_first_event(cluster, listed)
    assert status == 200
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"

    # What nodeagent makes of it, as lightkube delivers it (an ApiError from the ERROR event).
    with pytest.raises(Gone) as raised:
        async with asyncio.timeout(30):
            async for delivered in node_api._watch(kinds.PINNED_IMAGE_SET, listed, None):
                pytest.fail(f"an expired watch delivered {delivered}")
    rejected = raised.value.__cause__
    assert isinstance(rejected, ApiRequestRejected)
    assert "HTTP 410" in rejected.message
    assert isinstance(rejected.__cause__, ApiError)
    assert rejected.__cause__.status.reason == "Expired"

    # The control: from the compaction's own revision the watch is valid and sees changes.
    stream = node_api._watch(kinds.PINNED_IMAGE_SET, str(compacted), None)
    assert isinstance(stream, AsyncGenerator)  # for aclose()
    first = asyncio.ensure_future(anext(stream))
    apply(cluster, pinned_image_set("expired-c", [REF]))
    async with asyncio.timeout(30):
        change, obj = await first
    assert (change, obj["metadata"]["name"]) == ("ADDED", "expired-c")
    await stream.aclose()
    cluster.kubectl_ok("delete", SETS, "expired-a", "expired-b", "expired-c")


# ------------------------------------------------------------------ the informer


async def test_informer_relists_when_its_first_watch_starts_from_a_compacted_version(
    expiring: ExpiringKube, client: NodeClient
) -> None:
    """The informer lists, yields, and only then watches from the list's version: a slow
    consumer leaves a gap in which a set is deleted and the history compacted."""
    cluster = expiring.cluster
    for name in ("gap-a", "gap-b"):
        apply(cluster, pinned_image_set(name, [REF]))
    informer = client.api.informer(kinds.PINNED_IMAGE_SET)
    assert isinstance(informer, AsyncGenerator)  # for aclose()
    async with asyncio.timeout(30):
        listed = await anext(informer)
    assert names(listed, "gap-") == {"gap-a", "gap-b"}

    cluster.kubectl_ok("delete", SETS, "gap-b")
    compacted = expiring.bump_and_compact()
    async with asyncio.timeout(30):
        relisted = await anext(informer)
    assert names(relisted, "gap-") == {"gap-a"}

    made = [(r.verb, r.version) for r in expiring.requests(client.user)]
    assert made[0] == ("list", "")
    assert made[1][0] == "watch"
    assert int(made[1][1]) < compacted
    assert made[2] == ("list", "")
    assert len(made) == 3
    await informer.aclose()
    cluster.kubectl_ok("delete", SETS, "gap-a")


async def test_informer_resumes_a_watch_the_server_ended_and_relists_once_it_expired(
    expiring: ExpiringKube, client: NodeClient
) -> None:
    """The API server ends every watch after a while (here 1 to 2 s). lightkube then asks
    again from the last version it saw: changes in between are replayed while etcd still
    has them (round 1), and answered with 410 once compacted, which relists (round 2)."""
    cluster = expiring.cluster
    user = client.user
    for name in ("resume-a", "resume-b", "resume-c"):
        apply(cluster, pinned_image_set(name, [REF]))
    informer = client.api.informer(kinds.PINNED_IMAGE_SET)
    assert isinstance(informer, AsyncGenerator)  # for aclose()
    async with asyncio.timeout(30):
        listed = await anext(informer)
    assert names(listed, "resume-") == {"resume-a", "resume-b", "resume-c"}

    pending = asyncio.ensure_future(anext(informer))
    apply(cluster, pinned_image_set("resume-new", [REF]))
    async with asyncio.timeout(30):
        added = await pending
    assert names(added, "resume-") == {"resume-a", "resume-b", "resume-c", "resume-new"}
    last_seen = added["resume-new"]["metadata"]["resourceVersion"]

    # Round 1: the consumer is busy while the server ends the watch; a set is deleted.
    await wait_requests(
        expiring, user, lambda made: made and made[-1].verb == "watch" and made[-1].is_complete,
        what="the API server to end the informer's first watch",
    )  # fmt: skip
    cluster.kubectl_ok("delete", SETS, "resume-b")
    async with asyncio.timeout(30):
        replayed = await anext(informer)
    assert names(replayed, "resume-") == {"resume-a", "resume-c", "resume-new"}
    made = expiring.requests(user)
    assert [r.verb for r in made] == ["list", "watch", "watch"]
    assert made[2].version == last_seen

    # Round 2: the same, but the history is compacted before the watch is resumed.
    await wait_requests(
        expiring, user, lambda made: len(made) == 3 and made[2].is_complete,
        what="the API server to end the informer's second watch",
    )  # fmt: skip
    cluster.kubectl_ok("delete", SETS, "resume-c")
    compacted = expiring.bump_and_compact()
    async with asyncio.timeout(30):
        relisted = await anext(informer)
    assert names(relisted, "resume-") == {"resume-a", "resume-new"}
    made = expiring.requests(user)
    assert [r.verb for r in made] == ["list", "watch", "watch", "watch", "list"]
    assert int(last_seen) < int(made[3].version) < compacted  # the deletion of resume-b
    await informer.aclose()
    cluster.kubectl_ok("delete", SETS, "resume-a", "resume-new")


# ------------------------------------------------------------------ cluster mode


def relisted_after_expiry(made: list[Request], since: int, compacted: int) -> bool:
    """A watch asked for after ``since`` from a version before ``compacted``, then a list."""
    return any(
        made[i].verb == "watch" and int(made[i].version) < compacted and made[i + 1].verb == "list"
        for i in range(since, len(made) - 1)
    )


async def test_cluster_specs_relist_after_expired_watches_and_keep_the_mirror(
    expiring: ExpiringKube, client: NodeClient, tmp_path: Path
) -> None:
    """ClusterSpecs' watches expire as they do in a cluster: the Node watch (a field selector
    on one quiet object) resumes from its list's version every time the server ends it, so
    after a compaction its next resume is a 410. The informers relist by themselves:
    no error, no 'unreachable', the spec files untouched, later changes still arrive."""
    cluster = expiring.cluster
    cluster.create_node(client.node)
    labels = {"expiry-e2e": "yes"}
    for name in ("mirror-a", "mirror-b"):
        apply(cluster, pinned_image_set(name, [REF], labels=labels))
    apply(cluster, pinned_image_set("mirror-other", [REF]))
    settings = ClusterSettings(
        enabled=True,
        kubeconfig=expiring.cluster.kubeconfig_for_node(client.node),
        node_name=client.node,
        set_selector="expiry-e2e=yes",
        request_timeout_s=10,
    )
    config = dataclasses.replace(Config.default(root=tmp_path), cluster=settings)
    specs = ClusterSpecs(
        config,
        client.api,
        Connection(client.api.server),
        mirror=mirror_directory,
        on_node=lambda _node: None,
        on_placement=lambda _placement: None,
    )
    mirror = config.cluster_specs_dir

    async def mirrored(expected: set[str]) -> bool:
        return mirror.is_dir() and {p.name for p in mirror.iterdir()} == expected

    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(specs.run())
        try:
            await wait_for_async(
                lambda: mirrored({"mirror-a.yaml", "mirror-b.yaml"}),
                timeout_s=30, what="the two sets mirrored",
            )  # fmt: skip
            written = {p.name: p.stat().st_ino for p in mirror.iterdir()}
            since = {kind: len(expiring.requests(client.user, kind)) for kind in (SETS, "nodes")}
            compacted = expiring.bump_and_compact()
            for kind in (SETS, "nodes"):
                await wait_requests(
                    expiring, client.user,
                    lambda made, k=kind: relisted_after_expiry(made, since[k], compacted),
                    resource=kind, what=f"the {kind} informer to relist after a 410",
                )  # fmt: skip
            assert {p.name: p.stat().st_ino for p in mirror.iterdir()} == written

            cluster.kubectl_ok("delete", SETS, "mirror-b")
            apply(cluster, pinned_image_set("mirror-c", [REF], labels=labels))
            await wait_for_async(
                lambda: mirrored({"mirror-a.yaml", "mirror-c.yaml"}),
                timeout_s=30, what="the mirror to follow a deletion and a creation",
            )  # fmt: skip
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    trouble = [e for e in logs if e["log_level"] in ("warning", "error")]
    assert trouble == []
    cluster.kubectl_ok("delete", SETS, "mirror-a", "mirror-c", "mirror-other")


async def test_cluster_specs_read_this_nodes_labels_once_for_bundle_targets(
    expiring: ExpiringKube, client: NodeClient, tmp_path: Path
) -> None:
    """``bundle import`` outside the daemon lists the Node once to judge a bundle's target;
    before that the labels are unknown (None), never an empty set."""
    settings = ClusterSettings(
        enabled=True,
        kubeconfig=expiring.cluster.kubeconfig_for_node(client.node),
        node_name=client.node,
        request_timeout_s=10,
    )
    config = dataclasses.replace(Config.default(root=tmp_path), cluster=settings)
    specs = ClusterSpecs(
        config,
        client.api,
        Connection(client.api.server),
        mirror=mirror_directory,
        on_node=lambda _node: None,
        on_placement=lambda _placement: None,
    )
    assert specs.node_labels() is None
    assert await specs.read_node_labels() is None  # no such Node yet
    expiring.cluster.create_node(client.node, labels={"site": "line-3", "zone": "a"})
    labels = await specs.read_node_labels()
    assert labels is not None
    assert (labels["site"], labels["zone"]) == ("line-3", "a")
    assert specs.node_labels() == labels
