"""deploy/openshift.list and deploy/kubernetes.list: what an admin applies per cluster type.
Applying a list never replaces OpenShift's own PinnedImageSet CRD, never applies an opt-in
grant, applies CRDs first and each admission policy before the RBAC it confines, and leaves
no manifest of deploy/ and deploy/crds/ unlisted (decision 0076)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
LISTS = {"openshift": DEPLOY / "openshift.list", "kubernetes": DEPLOY / "kubernetes.list"}
OPENSHIFT_GROUP = "machineconfiguration.openshift.io"
OPT_IN_RESOURCES = {"configmaps", "clusterversions"}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}


def listed(kind: str) -> list[str]:
    lines = LISTS[kind].read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def objects(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def kinds(name: str) -> set[str]:
    return {doc["kind"] for doc in objects(name)}


def opt_in_grants(name: str) -> list[str]:
    """Write verbs on ConfigMaps or ClusterVersion: what only opt-in/ may grant nodes."""
    found = []
    for doc in objects(name):
        for rule in doc.get("rules", []) if doc["kind"] in {"Role", "ClusterRole"} else []:
            resources = set(rule.get("resources", [])) & OPT_IN_RESOURCES
            if resources and WRITE_VERBS & set(rule.get("verbs", [])):
                found.append(f"{doc['kind']} {doc['metadata']['name']}: {sorted(resources)}")
    return found


@pytest.mark.parametrize("kind", sorted(LISTS))
def test_a_list_names_existing_files_once_without_opt_in_grants(kind: str) -> None:
    names = listed(kind)
    assert len(names) == len(set(names))
    for name in names:
        assert (DEPLOY / name).is_file(), name
        assert not name.startswith(("opt-in/", "monitoring/", "machineconfig/")), name
        assert opt_in_grants(name) == [], name


@pytest.mark.parametrize("kind", sorted(LISTS))
def test_crds_come_first_and_policies_before_rbac(kind: str) -> None:
    order = [kinds(name) for name in listed(kind)]
    crds = [i for i, k in enumerate(order) if "CustomResourceDefinition" in k]
    assert crds == list(range(len(crds)))
    policies = [i for i, k in enumerate(order) if "ValidatingAdmissionPolicy" in k]
    rbac = [i for i, k in enumerate(order) if k & {"ClusterRoleBinding", "RoleBinding"}]
    assert policies and rbac and min(policies) < min(rbac)


def crd_groups(kind: str) -> set[str]:
    return {
        doc["spec"]["group"]
        for name in listed(kind)
        for doc in objects(name)
        if doc["kind"] == "CustomResourceDefinition"
    }


def test_openshift_never_gets_our_pinnedimageset_crd_and_kubernetes_does() -> None:
    assert OPENSHIFT_GROUP not in crd_groups("openshift")
    assert OPENSHIFT_GROUP in crd_groups("kubernetes")
    assert "upgrade-gate.yaml" in listed("openshift")  # ClusterVersion exists only there


def test_every_manifest_is_in_some_list_and_opt_in_grants_are_only_opt_in() -> None:
    manifests = {p.relative_to(DEPLOY).as_posix() for p in DEPLOY.glob("*.yaml")}
    manifests |= {p.relative_to(DEPLOY).as_posix() for p in (DEPLOY / "crds").glob("*.yaml")}
    assert manifests == set(listed("openshift")) | set(listed("kubernetes"))
    for path in (DEPLOY / "opt-in").glob("*.yaml"):
        assert opt_in_grants(path.relative_to(DEPLOY).as_posix()), f"{path.name} grants nothing"


def test_the_package_ships_the_lists_and_the_guide_uses_them() -> None:
    spec = (ROOT / "packaging" / "nodeagent.spec").read_text()
    assert "install -Dm0644 -t %{buildroot}%{_datadir}/nodeagent/deploy deploy/*.list" in spec
    guide = (ROOT / "docs" / "cluster.md").read_text()
    for kind in LISTS:
        assert f"grep -v '^#' {kind}.list | xargs -n1 kubectl apply --server-side -f" in guide
