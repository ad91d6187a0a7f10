"""A stand-in for OpenShift's cluster-version operator (CVO), on the test kube-apiserver.

No CVO runs here; the tests need a ClusterVersion whose status moves as the CVO moves it
(docs/runtime-facts.md, "ClusterVersion and the cluster-version operator"):

* installed at a version: ``status.desired`` is that release, ``status.history`` one
  ``Completed`` entry, ``Available=True``, ``Progressing=False``, ``Failing=False``;
* an admin sets ``spec.desiredUpdate`` (``image``, by digest): ``begin`` (or ``reconcile``) makes
  that release ``status.desired``, sets the completion time of the newest entry when it has
  none, puts a ``Partial`` entry first (``startedTime`` now, ``completionTime`` null),
  ``Progressing=True`` "Working towards <version>", ``observedGeneration`` the spec's generation;
* ``complete``: the newest entry becomes ``Completed`` with its completion time,
  ``Progressing=False`` "Cluster version is <version>";
* ``fail``: ``Failing=True`` with a reason and message, the entry stays ``Partial``;
* the history keeps at most ``MAX_HISTORY`` entries, newest first.

Every status write goes to ``clusterversions/version/status`` as the CVO's own identity
(a ServiceAccount of ``openshift-cluster-version``, given every permission here), so a test
sees whether admission lets the CVO's writes through. The CRD is openshift/api's own schema
(manifests/clusterversion-v1.yaml, source in its header); the contract suite is
tests/integration/cluster/test_cvo_standin.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from tests.testenv.kube import KubeCluster

CLUSTER_VERSION_CRD: Final = Path(__file__).parent / "manifests" / "clusterversion-v1.yaml"
"""openshift/api's ClusterVersion CRD (Default feature set), source in its header."""
CVO_USER: Final = "system:serviceaccount:openshift-cluster-version:default"
CVO_GROUPS: Final = ("system:serviceaccounts", "system:masters")
MAX_HISTORY: Final = 100
"""The CVO prunes its history to this many entries (``MaxHistory``)."""
CLUSTER_ID: Final = "0f6f2d0e-2c1b-4a7e-9d51-6f1f3a8c9b10"
REPO: Final = "quay.io/openshift-release-dev/ocp-release"


def release_image(digest: str, repo: str = REPO) -> str:
    """A release pull spec by digest (``sha256:<hex>``)."""
    return f"{repo}@{digest}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Target:
    version: str
    image: str


def install_crd(kube: KubeCluster) -> None:
    """openshift/api's ClusterVersion CRD, served once this returns."""
    kube.kubectl_ok("apply", "--server-side", "-f", str(CLUSTER_VERSION_CRD))
    kube.kubectl_ok(
        "wait", "--for=condition=Established", "--timeout=60s", "-f", str(CLUSTER_VERSION_CRD)
    )


class CvoStandIn:
    """Moves ``clusterversions/version`` status as the CVO does; one instance per cluster."""

    def __init__(self, kube: KubeCluster) -> None:
        self.kube = kube
        self.kubeconfig = kube.kubeconfig_for(CVO_USER, CVO_GROUPS)

    # ------------------------------------------------------------ reading
    def get(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            self.kube.kubectl_ok("get", "clusterversion", "version", "-o", "json")
        )
        return found

    # ------------------------------------------------------------ install
    def install(self, version: str, image: str, *, channel: str = "") -> dict[str, Any]:
        """A cluster installed at ``version`` (``image`` by digest), its one update completed.
        The ClusterVersion is created (or replaced) by the admin, the status by the CVO."""
        spec: dict[str, Any] = {"clusterID": CLUSTER_ID}
        if channel:
            spec["channel"] = channel
        body = {
            "apiVersion": "config.openshift.io/v1",
            "kind": "ClusterVersion",
            "metadata": {"name": "version"},
            "spec": spec,
        }
        self.kube.kubectl("delete", "clusterversion", "version", "--ignore-not-found", "--wait")
        self.kube.kubectl_ok("create", "-f", "-", input=json.dumps(body))
        now = _now()
        status = self._base_status(version, image) | {
            "history": [
                {
                    "state": "Completed",
                    "version": version,
                    "image": image,
                    "startedTime": now,
                    "completionTime": now,
                    "verified": False,
                }
            ],
            "conditions": _conditions(
                progressing=("False", "", f"Cluster version is {version}"), failing=None, now=now
            ),
        }
        return self.write_status(status)

    def _base_status(self, version: str, image: str) -> dict[str, Any]:
        generation = self.get()["metadata"].get("generation", 1)
        return {
            "desired": {"version": version, "image": image},
            "observedGeneration": generation,
            "versionHash": "standin",
            "availableUpdates": None,
            "capabilities": {},
        }

    # ------------------------------------------------------------ moves
    def reconcile(self, version: str = "") -> dict[str, Any] | None:
        """What the CVO does on a sync: a ``spec.desiredUpdate`` naming another image than
        ``status.desired`` begins that update (``version`` as the release says it, since the
        stand-in reads no payload); else the status is left alone (None)."""
        current = self.get()
        update = current["spec"].get("desiredUpdate") or {}
        image = update.get("image", "")
        if not image or image == current.get("status", {}).get("desired", {}).get("image"):
            return None
        return self.begin(Target(version or update.get("version", ""), image))

    def begin(self, target: Target) -> dict[str, Any]:
        """The update to ``target`` starts: a new ``Partial`` entry first, Progressing."""
        current = self.get()
        status = dict(current.get("status") or {})
        now = _now()
        history = [dict(entry) for entry in status.get("history") or []]
        if history and history[0].get("completionTime") is None:
            history[0]["completionTime"] = now
        history.insert(
            0,
            {
                "state": "Partial",
                "version": target.version,
                "image": target.image,
                "startedTime": now,
                "completionTime": None,
                "verified": False,
            },
        )
        status.update(
            desired={"version": target.version, "image": target.image},
            observedGeneration=current["metadata"].get("generation", 1),
            history=history[:MAX_HISTORY],
            conditions=_conditions(
                progressing=("True", "", f"Working towards {target.version}"),
                failing=None,
                now=now,
                previous=status.get("conditions") or [],
            ),
        )
        return self.write_status(status)

    def complete(self) -> dict[str, Any]:
        """The running update completed: the newest entry ``Completed``, Progressing False."""
        status = dict(self.get().get("status") or {})
        now = _now()
        history = [dict(entry) for entry in status.get("history") or []]
        if not history or history[0]["state"] != "Partial":
            raise AssertionError("no update runs: nothing to complete")
        history[0].update(state="Completed", completionTime=now)
        status.update(
            history=history,
            conditions=_conditions(
                progressing=("False", "", f"Cluster version is {history[0]['version']}"),
                failing=None,
                now=now,
                previous=status.get("conditions") or [],
            ),
        )
        return self.write_status(status)

    def fail(self, reason: str, message: str) -> dict[str, Any]:
        """The running update fails: Failing True; the entry stays ``Partial``."""
        status = dict(self.get().get("status") or {})
        history = status.get("history") or [{}]
        version = history[0].get("version", "")
        status["conditions"] = _conditions(
            progressing=("True", reason, f"Unable to apply {version}: {message}"),
            failing=(reason, message),
            now=_now(),
            previous=status.get("conditions") or [],
        )
        return self.write_status(status)

    def write_status(
        self, status: dict[str, Any], *, kubeconfig: Path | None = None
    ) -> dict[str, Any]:
        """Replace ``status`` through the status subresource (a PUT of the object as read, so a
        null ``completionTime`` stays null), as the CVO (by default)."""
        obj = self.get()
        obj["status"] = status
        out = self.kube.kubectl_ok(
            "replace", "--subresource=status", "-o", "json", "-f", "-",
            kubeconfig=kubeconfig or self.kubeconfig, input=json.dumps(obj),
        )  # fmt: skip
        written: dict[str, Any] = json.loads(out)
        return written


def _conditions(
    *,
    progressing: tuple[str, str, str],
    failing: tuple[str, str] | None,
    now: str,
    previous: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Available, Failing, Progressing (ClusterOperatorStatusCondition), transition times kept
    when the status did not change."""
    before = {c.get("type"): c for c in previous or []}
    wanted = [
        ("Available", "True", "", "Done applying" if progressing[0] == "False" else ""),
        ("Failing", "True" if failing else "False", *(failing or ("", ""))),
        ("Progressing", *progressing),
    ]
    out = []
    for kind, status, reason, message in wanted:
        old = before.get(kind)
        since = old["lastTransitionTime"] if old and old.get("status") == status else now
        item = {"type": kind, "status": status, "lastTransitionTime": since}
        item |= {k: v for k, v in (("reason", reason), ("message", message)) if v}
        out.append(item)
    return out
