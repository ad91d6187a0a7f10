"""The container runtime as nodeagent sees it: image records, versions, and the port.

These are plain values; the CRI adapter (``nodeagent.adapters.cri.client``) fills
them from gRPC messages, and every service that needs the runtime receives an
``ImageRuntime`` rather than a gRPC client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RuntimeVersion:
    """What CRI ``Version`` reports."""

    runtime_name: str
    runtime_version: str
    runtime_api_version: str


@dataclass(frozen=True, slots=True)
class StoredImage:
    """One image in the runtime's store, as CRI ``Image`` describes it."""

    id: str
    repo_tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    size_bytes: int
    is_pinned: bool

    def names(self) -> tuple[str, ...]:
        """Every name the runtime knows this image by (tags and digests)."""
        return self.repo_tags + self.repo_digests


@dataclass(frozen=True, slots=True)
class FilesystemUsage:
    """CRI ``ImageFsInfo`` for one filesystem: usage only, never capacity."""

    mountpoint: str
    used_bytes: int
    inodes_used: int


@dataclass(frozen=True, slots=True)
class RegistryCredentials:
    """Credentials for one registry, passed to the runtime with a pull.

    ``repr`` hides every secret so that logging the object leaks nothing.
    """

    server_address: str
    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)
    auth: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    registry_token: str = field(default="", repr=False)


class ImageRuntime(Protocol):
    """The image side of a CRI runtime (port implemented by ``adapters.cri.CriClient``)."""

    async def version(self) -> RuntimeVersion: ...

    async def list_images(self) -> list[StoredImage]: ...

    async def image_status(self, ref: str) -> StoredImage | None: ...

    async def pull_image(
        self,
        ref: str,
        credentials: RegistryCredentials | None = None,
        *,
        timeout_s: float | None = None,
    ) -> str: ...

    async def remove_image(self, ref: str) -> None: ...

    async def image_fs_info(self) -> list[FilesystemUsage]: ...
