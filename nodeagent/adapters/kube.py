"""The Kubernetes API, through lightkube, as plain dicts and nodeagent errors.

Only this module imports lightkube (and, through it, httpx2); the daemon imports it
only in cluster mode, so a node without a cluster never pays for it in memory.

* ``KubeApi.informer`` is list-then-watch: it yields the complete set of objects after the
  list and after every change. When the API server ends a watch (after 30 to 60 min),
  lightkube asks again from the last version seen. An expired version (410: an ERROR event
  in an HTTP 200 answer, as the API server sends it) relists, so a deletion missed in
  between is still seen; a broken connection raises ``ApiUnreachable`` and the caller
  starts a new informer (which relists) after its backoff.
* Writes are server-side apply with field manager ``nodeagent``, except where several nodes
  add to one object: ``create``, then ``merge_patch`` (a JSON merge patch never removes what
  it does not name; an apply by the one field manager would remove what another node added).
* Errors map to the tree: no connection or 5xx/429 -> ApiUnreachable, 401/403 ->
  ApiAccessDenied, other 4xx -> ApiRequestRejected; a bad kubeconfig -> KubeconfigInvalid.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError, ConfigError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.types import PatchType

from nodeagent.cluster.api import Obj
from nodeagent.cluster.kinds import ResourceKind
from nodeagent.errors import (
    ApiAccessDenied,
    ApiRequestRejected,
    ApiUnreachable,
    KubeconfigInvalid,
    NodeAgentError,
)

_RESOURCES: dict[ResourceKind, Any] = {}
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""A pod's service account (token, ca.crt, namespace): the credentials in-cluster."""


def _resource(kind: ResourceKind) -> Any:
    """lightkube's generic resource class for ``kind`` (Any: its overloads pick the scope
    statically, ours is chosen at run time)."""
    if kind not in _RESOURCES:
        make = create_namespaced_resource if kind.is_namespaced else create_global_resource
        _RESOURCES[kind] = make(kind.group, kind.version, kind.kind, kind.plural)
    return _RESOURCES[kind]


def _plain(obj: Any) -> Obj:
    doc: Obj = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
    return doc


@contextlib.contextmanager
def _mapped(what: str) -> Iterator[None]:
    """Turn lightkube/httpx errors into the error tree, naming the request."""
    try:
        yield
    except ApiError as exc:
        raise _from_status(what, exc.status.code or 0, exc.status.message or str(exc)) from exc
    except httpx2.HTTPStatusError as exc:
        raise _from_status(what, exc.response.status_code, str(exc)) from exc
    except (httpx2.TransportError, OSError) as exc:
        raise ApiUnreachable(f"{what}: the API server does not answer: {exc}") from exc


def _from_status(what: str, code: int, message: str) -> NodeAgentError:
    text = f"{what}: HTTP {code}: {message}"
    if code in (401, 403):
        return ApiAccessDenied(
            text + " (the node's identity lacks the RBAC of deploy/rbac.yaml, or the "
            "admission policy refused it)"
        )
    if code == 429 or code >= 500:
        return ApiUnreachable(text)
    return ApiRequestRejected(text)


def check_kubeconfig(kubeconfig: Path) -> None:
    """Load ``kubeconfig`` and resolve its current context as the client will
    (``check-config``); ``KubeconfigInvalid`` saying why when it cannot be used."""
    try:
        KubeConfig.from_file(str(kubeconfig)).get()
    except (ConfigError, OSError, ValueError, KeyError, TypeError) as exc:
        raise KubeconfigInvalid(
            f"[cluster] enabled, but the kubeconfig {kubeconfig} cannot be used: {exc}; set "
            "[cluster] kubeconfig to the node's kubeconfig (the kubelet's is "
            "/var/lib/kubelet/kubeconfig)"
        ) from exc


class Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""


class KubeApi:
    """One client for the node's identity; every method returns plain JSON-like dicts."""

    def __init__(
        self,
        kubeconfig: Path | None,
        *,
        timeout_s: float,
        field_manager: str,
        service_account: Path = SERVICE_ACCOUNT_DIR,
    ) -> None:
        """``kubeconfig`` None: in-cluster, from ``service_account`` and the
        ``KUBERNETES_SERVICE_HOST``/``_PORT`` environment a pod gets."""
        try:
            config = (
                KubeConfig.from_file(str(kubeconfig))
                if kubeconfig is not None
                else KubeConfig.from_service_account(service_account)
            )
            self._client = AsyncClient(config=config, timeout=httpx2.Timeout(timeout_s))
        except (ConfigError, OSError, ValueError, KeyError) as exc:
            if kubeconfig is None:
                raise KubeconfigInvalid(
                    f"cannot use the in-cluster service account {service_account}: {exc}; "
                    "run in a pod (KUBERNETES_SERVICE_HOST set, its token mounted) or pass "
                    "--kubeconfig"
                ) from exc
            raise KubeconfigInvalid(
                f"cannot use kubeconfig {kubeconfig}: {exc}; set [cluster] kubeconfig to the "
                "node's kubeconfig (the kubelet's is /var/lib/kubelet/kubeconfig)"
            ) from exc
        self.field_manager = field_manager
        self.server = str(self._client.config.cluster.server)

    async def close(self) -> None:
        await self._client.close()

    async def get(self, kind: ResourceKind, name: str, namespace: str | None = None) -> Obj | None:
        """The object, or None when it does not exist."""
        try:
            with _mapped(f"get {kind} {name}"):
                obj = await self._client.get(_resource(kind), name, namespace=namespace)
        except ApiRequestRejected as exc:
            if "HTTP 404" in exc.message:
                return None
            raise
        return _plain(obj)

    async def is_served(self, kind: ResourceKind) -> bool:
        """Whether the API server serves ``kind`` at all (its CRD is installed)."""
        try:
            await self.list(kind, limit=1)
        except ApiRequestRejected as exc:
            if "HTTP 404" in exc.message:
                return False
            raise
        return True

    async def list(
        self, kind: ResourceKind, *, field_selector: str | None = None, limit: int | None = None
    ) -> tuple[list[Obj], str]:
        """Every object (chunked), and the list's resourceVersion to watch from."""
        fields = _field_dict(field_selector)
        with _mapped(f"list {kind}"):
            options: dict[str, Any] = {"fields": fields, "chunk_size": limit}
            found = self._client.list(_resource(kind), **options, **_every_namespace(kind))
            items = []
            async for item in found:
                items.append(_plain(item))
                if limit is not None and len(items) >= limit:
                    break
            version = str(found.resourceVersion) if items or limit is None else ""
        return items, version

    async def informer(
        self, kind: ResourceKind, *, field_selector: str | None = None
    ) -> AsyncIterator[dict[str, Obj]]:
        """List, then watch: yields every object by name, after the list and after each change."""
        while True:
            items, version = await self.list(kind, field_selector=field_selector)
            state = {_name(item): item for item in items}
            yield dict(state)
            try:
                async for kind_of_change, obj in self._watch(kind, version, field_selector):
                    if kind_of_change == "DELETED":
                        state.pop(_name(obj), None)
                    elif kind_of_change in ("ADDED", "MODIFIED"):
                        state[_name(obj)] = obj
                    else:
                        continue
                    yield dict(state)
            except Gone:
                continue

    async def _watch(
        self, kind: ResourceKind, version: str, field_selector: str | None
    ) -> AsyncIterator[tuple[str, Obj]]:
        options: dict[str, Any] = {
            "resource_version": version,
            "fields": _field_dict(field_selector),
            **_every_namespace(kind),
        }
        stream = self._client.watch(_resource(kind), **options)
        try:
            with _mapped(f"watch {kind}"):
                async for change, obj in stream:
                    yield change, _plain(obj)
        except ApiRequestRejected as exc:
            if "HTTP 410" in exc.message:
                raise Gone from exc
            raise

    async def apply(self, kind: ResourceKind, body: Obj, *, subresource: str | None = None) -> Obj:
        """Server-side apply of ``body`` (forced: nodeagent is the only writer of its fields)."""
        resource = _resource(kind)
        name = body["metadata"]["name"]
        namespace = body["metadata"].get("namespace")
        what = f"apply {kind} {name}" + (f"/{subresource}" if subresource else "")
        with _mapped(what):
            if subresource == "status":
                result = await self._client.apply(
                    resource.Status(**body),
                    name,
                    namespace=namespace,
                    field_manager=self.field_manager,
                    force=True,
                )
            else:
                result = await self._client.apply(
                    resource(**body), field_manager=self.field_manager, force=True
                )
        return _plain(result)

    async def create(self, kind: ResourceKind, body: Obj) -> Obj:
        name = body["metadata"]["name"]
        with _mapped(f"create {kind} {name}"):
            result = await self._client.create(
                _resource(kind)(**body), field_manager=self.field_manager
            )
        return _plain(result)

    async def merge_patch(
        self, kind: ResourceKind, name: str, patch: Obj, namespace: str | None = None
    ) -> Obj:
        """A JSON merge patch (RFC 7386): sets what ``patch`` names and leaves the rest."""
        with _mapped(f"patch {kind} {name}"):
            result = await self._client.patch(
                _resource(kind),
                name,
                patch,
                namespace=namespace,
                patch_type=PatchType.MERGE,
                field_manager=self.field_manager,
            )
        return _plain(result)


def _every_namespace(kind: ResourceKind) -> dict[str, Any]:
    """A list or watch of a namespaced kind covers every namespace (lightkube's ``"*"``), not
    the kubeconfig's default namespace (this node's pods are in many)."""
    return {"namespace": "*"} if kind.is_namespaced else {}


def _field_dict(selector: str | None) -> dict[str, Any] | None:
    if not selector:
        return None
    return dict(item.split("=", 1) for item in selector.split(","))


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))
