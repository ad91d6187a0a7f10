"""One construction of the registry client for every path that reads registries itself.

Disk sizing's look-ups (the daemon), the node store's registry sets (``[store]
registry_sets``) and ``nodeagent bundle create`` choose hosts, credentials and CAs the same
way, the way CRI-O chooses them for its pulls (docs/decisions/0048):

* hosts: registries.conf's mirrors, then the image's own registry
  (``mirrors.pull_sources``), over plain HTTP only where registries.conf (or ``bundle
  create --insecure-registry``) says so; read again when those files change;
* credentials: the entry of the host a request goes to, from nodeagent's auth file first,
  else from the file CRI-O's ``[crio.image] global_auth_file`` names (crio.conf and its
  drop-ins, looked up again at ``on_sync``);
* TLS: a host's containers-certs.d(5) CAs and client certificate (``[runtime] certs_dirs``);
* a host that could not be reached is not asked again until ``on_sync``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from nodeagent.adapters.crio_config import CrioDropins
from nodeagent.adapters.host import InsecureRegistries, RuntimeAuthFile, first_credentials
from nodeagent.adapters.registry.cache import ManifestCache
from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.config import RuntimeSettings
from nodeagent.ports import RegistryCredentials
from nodeagent.registries import Platform

CredentialsFor = Callable[[str], RegistryCredentials | None]


@dataclass(frozen=True, slots=True)
class RegistryAccess:
    """The client and the credentials it chooses with (nodeagent's, then CRI-O's)."""

    client: RegistryClient
    credentials_for: CredentialsFor
    runtime_auth: RuntimeAuthFile

    def on_sync(self) -> None:
        """A new sync: ask unreachable hosts again, find CRI-O's auth file again."""
        self.client.unreachable.forget()
        self.runtime_auth.refresh()


def registry_access(
    runtime: RuntimeSettings,
    own_credentials: CredentialsFor,
    *,
    extra_insecure: Collection[str] = (),
    cache: ManifestCache | None = None,
    platform: Platform | None = None,
    timeout_s: float | None = None,
) -> RegistryAccess:
    """The registry client as ``runtime`` (``[runtime]``) configures it; see the module
    docstring. ``extra_insecure``: more hosts reached over plain HTTP (``bundle create``'s
    option); ``timeout_s`` defaults to ``runtime.call_timeout_s``."""
    registries = InsecureRegistries(runtime.registries_conf, runtime.registries_dir)
    extra = frozenset(extra_insecure)
    dropins = CrioDropins(
        runtime.config_file, runtime.config_dir, runtime.transient_dropin_dir, runtime.dropin_name
    )
    runtime_auth = RuntimeAuthFile(dropins.global_auth_file)
    runtime_auth.refresh()
    credentials_for = first_credentials(own_credentials, runtime_auth.credentials_for)
    client = RegistryClient(
        insecure=(lambda: registries() | extra) if extra else registries,
        timeout_s=runtime.call_timeout_s if timeout_s is None else timeout_s,
        cache=cache,
        platform=platform,
        routes=registries.routes,
        credentials_for=credentials_for,
        certs_dirs=runtime.certs_dirs,
    )
    return RegistryAccess(client, credentials_for, runtime_auth)
