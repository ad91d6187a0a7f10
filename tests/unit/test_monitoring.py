"""deploy/monitoring/ holds together, and each alert's runbook carries its catalog entry.

The DaemonSet, Service and ServiceMonitor must name the same labels, ports and Secret, the
proxy must forward to the address nodeagent listens on by default, and every alert's
``runbook_url`` must lead to a section of docs/alerts.md whose quoted text is, word for word,
the journald catalog entry of the event it names (``systemd/nodeagent.catalog``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.config import MetricsSettings
from nodeagent.config.addresses import parse_address
from nodeagent.journal import MESSAGE_IDS
from nodeagent.specs import parse_spec_text

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
ALERTS_DOC = ROOT / "docs" / "alerts.md"
CATALOG = ROOT / "systemd" / "nodeagent.catalog"
RUNBOOK_BASE = "file:///usr/share/doc/nodeagent/alerts.md#"


def load(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((MONITORING / name).read_text()) if doc]


def one(name: str, kind: str) -> dict[str, Any]:
    found = [doc for doc in load(name) if doc["kind"] == kind]
    assert len(found) == 1, (name, kind)
    return found[0]


def proxy_args() -> dict[str, str]:
    container = one("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    return dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])


def test_every_manifest_loads_and_lives_in_the_monitoring_namespace() -> None:
    namespace = one("namespace.yaml", "Namespace")
    name = namespace["metadata"]["name"]
    assert namespace["metadata"]["labels"]["openshift.io/cluster-monitoring"] == "true"
    files = sorted(MONITORING.glob("*.yaml"))
    assert [p.name for p in files] == [
        "daemonset.yaml",
        "namespace.yaml",
        "pinnedimagesets.yaml",
        "prometheusrule.yaml",
        "rbac.yaml",
        "service.yaml",
        "servicemonitor.yaml",
    ]
    for path in files:
        for doc in load(path.name):
            assert doc["apiVersion"] and doc["kind"], path
            is_cluster_scoped = doc["kind"] in (
                "Namespace",
                "ClusterRole",
                "ClusterRoleBinding",
                "PinnedImageSet",
            )
            assert is_cluster_scoped or doc["metadata"]["namespace"] == name, (path, doc["kind"])


_BY_DIGEST = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+@sha256:[a-f0-9]{64}$")


def images_in(doc: Any) -> list[str]:
    """Every ``image`` value of a pod template anywhere in ``doc``."""
    found: list[str] = []
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.extend(v for k, v in item.items() if k == "image" and isinstance(v, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def test_every_image_deploy_runs_is_by_digest_and_pinned_on_every_pool() -> None:
    """A site without a registry runs the proxy only if every node holds it: the image is
    named by digest and is in a set for each pool role the DaemonSet runs on."""
    deploy = ROOT / "deploy"
    images = {
        image
        for path in sorted(deploy.rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") in ("DaemonSet", "Deployment", "Pod", "Job", "StatefulSet")
        for image in images_in(doc)
    }
    assert images, "no workload in deploy/"
    for image in images:
        assert _BY_DIGEST.match(image), f"{image}: not by digest"
    text = (MONITORING / "pinnedimagesets.yaml").read_text()
    loaded = parse_spec_text(text, source="pinnedimagesets.yaml", is_persistent=True)
    assert loaded.problems == ()
    roles = {s.name.rsplit("-", 1)[-1] for s in loaded.sets}
    assert roles == {"master", "worker"}
    for doc in load("pinnedimagesets.yaml"):
        role = doc["metadata"]["name"].rsplit("-", 1)[-1]
        assert doc["metadata"]["labels"]["machineconfiguration.openshift.io/role"] == role
    for image_set in loaded.sets:
        assert {str(ref) for ref in image_set.images} == images, image_set.name


def test_the_proxy_forwards_to_the_default_loopback_endpoint_and_listens_on_its_port() -> None:
    args = proxy_args()
    listen = parse_address(MetricsSettings().listen)
    assert args["upstream"] == f"http://{listen.host}:{listen.port}/"
    assert listen.host == "127.0.0.1"
    assert args["allow-paths"] == "/metrics"
    spec = one("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    port = spec["containers"][0]["ports"][0]
    assert args["secure-listen-address"] == f"$(NODE_IP):{port['containerPort']}"
    assert port["hostPort"] == port["containerPort"]
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"


def test_daemonset_service_and_servicemonitor_refer_to_each_other() -> None:
    daemonset = one("daemonset.yaml", "DaemonSet")
    service = one("service.yaml", "Service")
    monitor = one("servicemonitor.yaml", "ServiceMonitor")
    pod = daemonset["spec"]["template"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    container_port = pod["spec"]["containers"][0]["ports"][0]
    service_port = service["spec"]["ports"][0]
    assert service_port["targetPort"] == container_port["name"]
    assert service_port["port"] == container_port["containerPort"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == service_port["name"]
    assert endpoint["scheme"] == "https"
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert endpoint["tlsConfig"]["serverName"] == f"{name}.{namespace}.svc"
    # The service CA's Secret is the one the proxy mounts, at the files its flags name.
    secret = service["metadata"]["annotations"][
        "service.beta.openshift.io/serving-cert-secret-name"
    ]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mount = pod["spec"]["containers"][0]["volumeMounts"][0]
    assert volumes[mount["name"]]["secret"]["secretName"] == secret
    args = proxy_args()
    assert args["tls-cert-file"] == f"{mount['mountPath']}/tls.crt"
    assert args["tls-private-key-file"] == f"{mount['mountPath']}/tls.key"
    # The job label the MetricsDown alert selects is the Service's.
    job = service["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    assert f'up{{job="{job}"}}' in rule_of("NodeAgentMetricsDown")["expr"]


def test_rbac_names_the_proxys_account_and_lets_prometheus_read_metrics() -> None:
    docs = load("rbac.yaml")
    account = next(d for d in docs if d["kind"] == "ServiceAccount")
    pod_spec = one("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == account["metadata"]["name"]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")}
    bindings = [d for d in docs if d["kind"].endswith("RoleBinding")]
    for binding in bindings:
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in roles
    proxy_rules = {
        (rule["apiGroups"][0], rule["resources"][0])
        for binding in bindings
        if binding["subjects"][0]["name"] == account["metadata"]["name"]
        for rule in roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]["rules"]
    }
    assert ("authentication.k8s.io", "tokenreviews") in proxy_rules
    assert ("authorization.k8s.io", "subjectaccessreviews") in proxy_rules
    readers = [r for r in roles.values() if any("nonResourceURLs" in x for x in r["rules"])]
    assert [r["rules"] for r in readers] == [[{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]]


# ---------------------------------------------------------------- runbooks


def rules() -> list[dict[str, Any]]:
    spec = one("prometheusrule.yaml", "PrometheusRule")["spec"]
    return [rule for group in spec["groups"] for rule in group["rules"]]


def rule_of(alert: str) -> dict[str, Any]:
    return next(rule for rule in rules() if rule.get("alert") == alert)


def catalog_entries() -> dict[str, str]:
    """MESSAGE_ID -> the entry's text (after its header lines), as ``journalctl -x`` shows it."""
    entries: dict[str, str] = {}
    for block in re.split(r"^-- ", CATALOG.read_text(), flags=re.M)[1:]:
        message_id, _, rest = block.partition("\n")
        _headers, _, text = rest.partition("\n\n")
        entries[message_id.strip()] = text.strip()
    return entries


def doc_sections() -> dict[str, str]:
    """GitHub-style anchor of each ``##`` heading -> the section's text."""
    parts = re.split(r"^## (.+)$", ALERTS_DOC.read_text(), flags=re.M)
    return {
        re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-"): body
        for title, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def test_the_alerts_a_site_pages_on_are_all_there() -> None:
    assert {rule["alert"] for rule in rules()} >= {
        "NodeAgentSetNotPinned",
        "NodeAgentBundleRefused",
        "NodeAgentDiskAdmissionRefused",
        "NodeAgentNotOfflineReady",
        "NodeAgentStoreCorrupt",
    }


@pytest.mark.parametrize("alert", [rule["alert"] for rule in rules()])
def test_each_runbook_section_quotes_its_catalog_entry_word_for_word(alert: str) -> None:
    url = rule_of(alert)["annotations"]["runbook_url"]
    assert url.startswith(RUNBOOK_BASE)
    section = doc_sections()[url.removeprefix(RUNBOOK_BASE)]
    named = re.search(r"Journal event `([a-z_]+)`, MESSAGE_ID `([0-9a-f]{32})`", section)
    assert named is not None, f"{alert}: its section names no journal event"
    event, message_id = named.groups()
    assert MESSAGE_IDS[event] == message_id
    quoted = re.search(r"```text\n(.*?)\n```", section, re.S)
    assert quoted is not None, f"{alert}: its section quotes no catalog text"
    assert quoted.group(1) == catalog_entries()[message_id]


def test_every_doc_section_is_some_alerts_runbook() -> None:
    anchors = {rule["annotations"]["runbook_url"].removeprefix(RUNBOOK_BASE) for rule in rules()}
    assert set(doc_sections()) == anchors
