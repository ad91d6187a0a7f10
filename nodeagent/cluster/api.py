"""The cluster feature's ports: the API server as the cluster tasks use it, and the spec mirror.

``adapters.kube.KubeApi`` implements ``KubeApi`` (lightkube, imported only in cluster
mode); ``adapters.files.mirror_directory`` implements ``SpecMirror``. Objects cross the
port as plain JSON-like dicts (``Obj``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

from nodeagent.cluster.kinds import ResourceKind

Obj = dict[str, Any]


class KubeApi(Protocol):
    @property
    def server(self) -> str: ...

    async def is_served(self, kind: ResourceKind) -> bool: ...

    def informer(
        self, kind: ResourceKind, *, field_selector: str | None = None
    ) -> AsyncIterator[dict[str, Obj]]: ...

    async def apply(
        self, kind: ResourceKind, body: Obj, *, subresource: str | None = None
    ) -> Obj: ...

    async def create(self, kind: ResourceKind, body: Obj) -> Obj: ...


class SpecMirror(Protocol):
    """Makes the ``*<suffix>`` files of a directory exactly ``files``; returns what changed."""

    def __call__(self, directory: Path, files: dict[str, bytes], *, suffix: str) -> list[str]: ...
