"""The files a configuration names, opened and parsed as the daemon will (``check-config``).

A configuration can be valid and still useless: a trusted key that is garbage, cluster mode
on with no kubeconfig, a site role with no certificate. The daemon would find out at its
start or at the first bundle; ``check-config`` finds out now, with the same loaders:

* the trusted keys (``[bundles] trusted_keys_dir``): every ``*.pub`` parsed as a minisign
  key and every ``*.pem`` as an ECDSA one (P-256, P-384), counted (none is said: no bundle
  would be accepted; on a host in FIPS mode, no ``*.pem`` is said too: decision 0075);
* with ``[cluster] enabled``: the kubeconfig loaded by lightkube, its current context
  resolved (as ``adapters.kube`` does);
* with ``[site] serve``: the serving certificate, its key and the CA loaded into a TLS
  server context; when the node fetches from peers (``[site] follow = "on"``, or ``"auto"``
  with ``peers`` or cluster mode): the client certificate, its key and the CA into a client
  context (``adapters.http.tls``: the key must be the certificate's).

Each problem is a ``NodeAgentError`` with its reason code; nothing is changed.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from nodeagent.adapters.bundles.tree import load_trusted_keys_dir
from nodeagent.config import Config
from nodeagent.errors import KubeconfigInvalid, NodeAgentError, SiteCertificatesInvalid
from nodeagent.site.roles import is_following


@dataclass(frozen=True, slots=True)
class ReferencedFiles:
    trusted_keys: int | None
    """Trusted keys found (None: they could not be read, a problem says why)."""
    problems: tuple[NodeAgentError, ...]
    notes: tuple[str, ...]
    """What is not wrong but worth saying (no trusted key)."""


def check_referenced_files(config: Config) -> ReferencedFiles:
    problems: list[NodeAgentError] = []
    notes: list[str] = []
    keys_dir = config.bundles.trusted_keys_dir
    count: int | None
    try:
        keys = load_trusted_keys_dir(keys_dir, fips_switch=config.bundles.fips_switch)
    except NodeAgentError as err:
        problems.append(err)
        count = None
    else:
        count = len(keys)
        if count and keys.host_fips and not keys.ecdsa:
            notes.append(
                f"this host is in FIPS mode and {keys_dir} holds no ECDSA key (*.pem): every "
                "bundle would be refused (Ed25519Refused); install the factory's ECDSA public "
                "key there (decision 0075)"
            )
    if count == 0:
        notes.append(
            f"no trusted key in {keys_dir}: every bundle would be refused "
            "(BundleSignedByUnknownKey); install the factory's public key there"
        )
    if config.cluster.enabled:
        problems += _kubeconfig(config.cluster.kubeconfig)
    site = config.site
    if site.serve:
        problems += _tls("the peer server ([site] serve)", site.cert_file, site.key_file,
                         site.ca_file, ssl.Purpose.CLIENT_AUTH)  # fmt: skip
    if is_following(config):
        problems += _tls("fetching from peers ([site] follow)", site.client_cert_file,
                         site.client_key_file, site.ca_file, ssl.Purpose.SERVER_AUTH)  # fmt: skip
    return ReferencedFiles(count, tuple(problems), tuple(notes))


def _kubeconfig(path: Path) -> list[NodeAgentError]:
    from nodeagent.adapters.kube import check_kubeconfig  # noqa: PLC0415  (cluster mode only)

    try:
        check_kubeconfig(path)
    except KubeconfigInvalid as err:
        return [err]
    return []


def _tls(role: str, cert: Path, key: Path, ca: Path, purpose: ssl.Purpose) -> list[NodeAgentError]:
    try:
        context = ssl.create_default_context(purpose, cafile=str(ca))
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError, ValueError) as exc:
        return [SiteCertificatesInvalid(
            f"{role} needs the certificate {cert}, its key {key} and the CA {ca}: "
            f"{getattr(exc, 'strerror', None) or exc}; on a node they are the kubelet's "
            "(docs/site.md, \"Access: mutual TLS\")"
        )]  # fmt: skip
    return []
