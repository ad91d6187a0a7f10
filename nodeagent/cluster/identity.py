"""This node's name in the cluster, as the kubelet knows it (pure).

The kubelet registers its Node under one name and authenticates as ``system:node:<name>``;
nodeagent must use the same name or the Node is never found and the admission policy of
deploy/ refuses its status write. The sources, first usable one wins
(docs/runtime-facts.md, "Node name"):

1. ``[cluster] node_name`` when configured;
2. the CN ``system:node:<name>`` of the kubelet's client certificate (the identity the API
   server itself sees);
3. the kubelet's ``--hostname-override``: on OpenShift nodes ``KUBELET_NODE_NAME`` in the
   environment files of ``kubelet.service`` (``[cluster] kubelet_env_files``);
4. the host name, whole (not cut at the first dot), trimmed and lower-cased, as the
   kubelet's own default.

A source whose value is not a DNS-1123 subdomain is skipped and named in the log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

NODE_USER_PREFIX = "system:node:"
MAX_NAME_CHARS = 253
MAX_ENV_FILE_BYTES = 64 * 1024
"""An environment file larger than this is not read (OpenShift's are under 1 KiB)."""
ENV_KEY = "KUBELET_NODE_NAME"
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_ENV_LINE_RE = re.compile(r"\s*(?:export\s+)?KUBELET_NODE_NAME\s*=\s*(?P<value>.*?)\s*")

Source = Literal["configured", "kubelet-certificate", "kubelet-override", "host-name"]
SOURCE_TEXT: dict[Source, str] = {
    "configured": "[cluster] node_name in nodeagent's configuration",
    "kubelet-certificate": "the kubelet's client certificate",
    "kubelet-override": "the kubelet's --hostname-override (KUBELET_NODE_NAME)",
    "host-name": "the host name",
}


@dataclass(frozen=True, slots=True)
class NodeName:
    name: str
    source: Source
    skipped: tuple[str, ...] = ()
    """Why earlier sources were not used (for the log), in order."""

    def describe(self) -> str:
        return f"node name {self.name} from {SOURCE_TEXT[self.source]}"


def is_node_name(name: str) -> bool:
    """A DNS-1123 subdomain: what the API server accepts as a Node's name."""
    return len(name) <= MAX_NAME_CHARS and _DNS_SUBDOMAIN_RE.fullmatch(name) is not None


def name_from_common_name(common_name: str) -> str | None:
    """``<name>`` of a CN ``system:node:<name>``; None for any other CN."""
    if not common_name.startswith(NODE_USER_PREFIX):
        return None
    name = common_name.removeprefix(NODE_USER_PREFIX)
    return name if is_node_name(name) else None


def override_from_env(texts: Iterable[str]) -> str | None:
    """``KUBELET_NODE_NAME`` as systemd would pass it from these environment files, in the
    unit's order (the last assignment wins); None when unset or empty (the kubelet then uses
    the host name). Quotes around the value are removed, as systemd removes them."""
    value: str | None = None
    for text in texts:
        for line in text.splitlines():
            match = _ENV_LINE_RE.fullmatch(line)
            if match is not None:
                value = _unquote(match["value"])
    return value or None


def name_from_host_name(host_name: str) -> str:
    """The kubelet's default: the host name trimmed and lower-cased, not cut at a dot."""
    return host_name.strip().lower()


def choose_node_name(
    configured: str,
    certificate_cn: str | None,
    override: str | None,
    host_name: str,
) -> NodeName:
    """The first usable source by the order of the module docstring."""
    if configured:
        return NodeName(configured, "configured")
    skipped = []
    if certificate_cn is None:
        skipped.append("no readable kubelet client certificate")
    else:
        from_cert = name_from_common_name(certificate_cn)
        if from_cert is not None:
            return NodeName(from_cert, "kubelet-certificate")
        skipped.append("the kubelet certificate's CN is not system:node:<a DNS name>")
    if override is not None:
        if is_node_name(override):
            return NodeName(override, "kubelet-override", tuple(skipped))
        skipped.append("KUBELET_NODE_NAME is not a DNS name")
    return NodeName(name_from_host_name(host_name), "host-name", tuple(skipped))


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value
