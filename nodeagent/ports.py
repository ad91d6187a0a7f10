"""The ports services share, each defined once, and the plain values that cross them.

A service receives its collaborators in its constructor, typed by these Protocols;
the adapters under ``nodeagent.adapters`` implement them and only the composition
root (``nodeagent.daemon``) and the CLI put the two together. The values are what the
ports carry: the runtime's image records (filled by the CRI adapter from gRPC
messages), registry credentials, a filesystem's space, and the typed events a pull
reports while it runs.

Ports here:
- ``ImageRuntime``: the image side of CRI (``adapters.cri.client.CriClient``).
- ``Reloader``: makes the runtime read its configuration again (``adapters.systemd``).
- ``StateStore``: small JSON documents in the state directory (``adapters.files``).
- ``SpaceProbe``: statvfs of a mountpoint (``adapters.host``).
- ``StatusLine``: systemd's one-line ``STATUS=`` (``adapters.systemd.Notifier``).
- ``PullEventSink``: where a pull's events go (``reporting``).
- ``PullTerms``: whether registry pulls may start and at what pace (``cluster.readiness``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


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


class Reloader(Protocol):
    """Makes the runtime read its configuration again; returns how (``dbus`` or ``sighup``)."""

    async def reload(self) -> str: ...


class StateStore(Protocol):
    """Named JSON documents kept across restarts (the ledger, the status, bundle records).

    ``load`` returns None for a document never saved and raises ``HostFileError`` when it
    cannot be read (``StateFileDamaged`` when it cannot be decoded); ``set_aside`` moves a
    damaged document out of the way (kept beside it for the report) and says where to.
    """

    def load(self, name: str) -> dict[str, Any] | None: ...

    def save(self, name: str, obj: dict[str, Any]) -> bool: ...

    def set_aside(self, name: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class FilesystemSpace:
    """statvfs of the runtime's image filesystem."""

    mountpoint: str
    total_bytes: int
    available_bytes: int


class SpaceProbe(Protocol):
    def space(self, mountpoint: str) -> FilesystemSpace: ...


class StatusLine(Protocol):
    """systemd's ``STATUS=`` line, what ``systemctl status`` shows."""

    def status(self, text: str) -> object: ...


class PullStep(enum.StrEnum):
    """What happened to one pull; the value is the journal's event name."""

    STARTED = "pull_started"
    RETRYING = "pull_retrying"
    PULLED = "image_pulled"
    FAILED = "pull_failed"


@dataclass(frozen=True, slots=True)
class PullEvent:
    """One step of one image's pull, as the pre-puller reports it while it runs."""

    step: PullStep
    ref: str
    attempt: int
    """The attempt this step belongs to; for an outcome, how many attempts it took."""
    seconds: float | None = None
    """Since the first attempt started (``PULLED`` and ``FAILED``)."""
    reason: str | None = None
    """The error's reason code (``RETRYING`` and ``FAILED``)."""
    error: str | None = None
    """The error's message (``RETRYING`` and ``FAILED``)."""
    retry_in_s: float | None = None
    """Delay before the next attempt (``RETRYING``)."""

    def fields(self) -> dict[str, object]:
        """The journal fields of this event, without the ones that do not apply."""
        is_outcome = self.step in (PullStep.PULLED, PullStep.FAILED)
        fields: dict[str, object] = {
            "image": self.ref,
            ("attempts" if is_outcome else "attempt"): self.attempt,
        }
        optional = {
            "seconds": self.seconds,
            "reason": self.reason,
            "error": self.error,
            "retry_in_s": self.retry_in_s,
        }
        return fields | {key: value for key, value in optional.items() if value is not None}


PullEventSink = Callable[[PullEvent], None]


@dataclass(frozen=True, slots=True)
class RunningContainer:
    """A running container as CRI ``ListContainers`` reports it (the offline drill's fact)."""

    id: str
    name: str
    image: str
    """The image the container was created from (``ImageSpec.image``)."""
    image_ref: str
    """The runtime's id or digest name of that image."""
    pod_namespace: str = ""
    pod_name: str = ""


@dataclass(frozen=True, slots=True)
class PullTerms:
    """The terms registry pulls start under (cluster mode, from this node's Node object);
    restores from the node's store and bundle imports ignore them."""

    held_reason: str = ""
    """A reason code (``NodeNotReady``, ``NodeDiskPressure``) while registry pulls must not
    start, or ``""``."""
    held_message: str = ""
    one_at_a_time: bool = False
    """A control-plane node: one registry pull at a time (etcd's disk is spared)."""
    pause_s: float = 0.0
    """Seconds between two registry pulls while ``one_at_a_time``."""
