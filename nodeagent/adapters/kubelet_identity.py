"""The kubelet's identity on this host: its client certificate, its environment files, the
host name (read only; the pure choice is ``nodeagent.cluster.identity``)."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import structlog

from nodeagent.cluster.identity import (
    MAX_ENV_FILE_BYTES,
    NodeName,
    choose_node_name,
    override_from_env,
)
from nodeagent.config import Config
from nodeagent.strict import MalformedInput, clip
from nodeagent.strict.x509_names import pem_subject_common_names

log = structlog.get_logger(__name__)

MAX_CERT_FILE_BYTES = 256 * 1024
"""The kubelet's certificate file (certificate and key, PEM) is a few KiB; a larger file is
not read."""


def certificate_common_name(path: Path) -> str | None:
    """The subject CN of the first PEM certificate in ``path``; None when the file is missing,
    too large, not PEM or has no single CN."""
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_CERT_FILE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_CERT_FILE_BYTES:
        return None
    try:
        names = pem_subject_common_names(data)  # not cryptography: decision 0069
    except MalformedInput:
        return None
    return names[0] if len(names) == 1 else None


def read_env_files(paths: tuple[Path, ...]) -> list[str]:
    """The text of each environment file that exists and is small enough, in order."""
    texts = []
    for path in paths:
        try:
            with path.open("rb") as stream:
                data = stream.read(MAX_ENV_FILE_BYTES + 1)
        except OSError:
            continue
        if len(data) <= MAX_ENV_FILE_BYTES:
            texts.append(data.decode("utf-8", errors="replace"))
    return texts


def identify_node(config: Config, *, host_name: str | None = None) -> NodeName:
    """This node's name by the kubelet's sources; logs once which one was used."""
    cluster = config.cluster
    if cluster.node_name:
        chosen = choose_node_name(cluster.node_name, None, None, "")
    else:
        chosen = choose_node_name(
            "",
            certificate_common_name(cluster.kubelet_client_cert),
            override_from_env(read_env_files(cluster.kubelet_env_files)),
            socket.gethostname() if host_name is None else host_name,
        )
    log.info(
        "node_name_chosen",
        node=clip(chosen.name),
        source=chosen.source,
        note=chosen.describe(),
        skipped="; ".join(chosen.skipped) or None,
    )
    return chosen


def with_node_name(config: Config, *, host_name: str | None = None) -> Config:
    """``config`` with ``[cluster] node_name`` set to the name ``identify_node`` chose."""
    chosen = identify_node(config, host_name=host_name)
    return dataclasses.replace(
        config, cluster=dataclasses.replace(config.cluster, node_name=chosen.name)
    )
