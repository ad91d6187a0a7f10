"""CRI client: ImageService, RuntimeService.Version and ListContainers over a unix socket.

The only module that speaks CRI. It turns ``runtime.v1`` messages into the
plain values of ``nodeagent.ports`` and every gRPC failure into the error
tree of ``nodeagent.errors`` (``raise ... from`` keeps the cause). The calls go
through ``grpc_h2``, a unary gRPC client on h2, not grpcio
(docs/decisions/0004-cri-client-over-h2.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final, TypeVar

from google.protobuf.message import DecodeError, Message

from nodeagent.adapters.cri import answers
from nodeagent.adapters.cri.api import runtime_v1_pb2 as pb
from nodeagent.adapters.cri.h2 import Channel
from nodeagent.adapters.cri.wire import RpcError
from nodeagent.adapters.cri.wire import StatusCode as StatusCode  # classify_rpc_error's
from nodeagent.errors import (
    ConfigInvalid,
    ImageNotFound,
    NodeAgentError,
    NoSpaceLeft,
    PullStalled,
    RegistryAuthFailed,
    RegistryError,
    RegistryUnavailable,
    RuntimeCallFailed,
    RuntimeTimeout,
    RuntimeUnreachable,
)
from nodeagent.ports import (
    FilesystemUsage,
    RegistryCredentials,
    RunningContainer,
    RuntimeVersion,
    StoredImage,
)
from nodeagent.strict import clip

CRI_API_VERSION: Final = "v1"
"""The CRI API version sent with ``Version`` requests."""

MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
"""Receive limit of one answer. ListImages on a node with thousands of images exceeds gRPC's
usual 4 MiB; 100,000 images (``answers.MAX_IMAGES``, ~300 bytes each) take ~30 MiB. A larger
answer is refused as its length prefix arrives, before it is buffered."""
MAX_DETAILS_CHARS: Final = 400
"""A runtime's error text (``grpc-message``) is cut to this in messages, after classifying."""

_IMAGE: Final = "/runtime.v1.ImageService/"
_RUNTIME: Final = "/runtime.v1.RuntimeService/"

_Req = TypeVar("_Req", bound=Message)
_Resp = TypeVar("_Resp", bound=Message)

# Patterns of runtime error texts (containers/image's errors as CRI-O 1.34 returns them,
# tests/integration/adapters/cri/test_pull_errors.py), checked in this order: a full disk
# matters more than the registry's reaction to the partial write, and a 5xx answer is the
# registry failing (RegistryError) rather than out of reach (RegistryUnavailable).
_TEXT_RULES: Final[tuple[tuple[re.Pattern[str], type[NodeAgentError]], ...]] = (
    (re.compile(r"no space left on device|disk quota exceeded"), NoSpaceLeft),
    (
        re.compile(r"unauthorized|authentication required|access denied|denied:"),
        RegistryAuthFailed,
    ),
    (re.compile(r"manifest unknown|name unknown|blob unknown|not found"), ImageNotFound),
    (re.compile(r"http status:? 5\d\d|status code:? 5\d\d"), RegistryError),
    # CRI-O cancels a pull that made no progress for its pull_progress_timeout (when set):
    # "storing blob to file …: happened during read: context canceled".
    (re.compile(r"context canceled"), PullStalled),
    (
        re.compile(
            r"connection refused|connection reset|broken pipe|no such host|no route to host"
            r"|network is unreachable|i/o timeout|tls handshake|unexpected eof|server misbehaving"
            r"|timeout awaiting response headers|too many requests|http status:? 429"
            r"|context deadline exceeded"
        ),
        RegistryUnavailable,
    ),
)

_CODE_RULES: Final[dict[StatusCode, type[NodeAgentError]]] = {
    StatusCode.UNAVAILABLE: RuntimeUnreachable,
    StatusCode.DEADLINE_EXCEEDED: RuntimeTimeout,
    StatusCode.NOT_FOUND: ImageNotFound,
    StatusCode.UNAUTHENTICATED: RegistryAuthFailed,
    StatusCode.PERMISSION_DENIED: RegistryAuthFailed,
}


def classify_rpc_error(code: StatusCode, details: str) -> type[NodeAgentError]:
    """Map a gRPC status to the error class nodeagent reports.

    CRI-O returns most pull failures as ``UNKNOWN`` with the underlying Go
    error as text, so the text is consulted before the status code.
    """
    if code in (StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED):
        return _CODE_RULES[code]
    text = details.lower()
    for pattern, error in _TEXT_RULES:
        if pattern.search(text):
            return error
    return _CODE_RULES.get(code, RuntimeCallFailed)


def socket_path(endpoint: str) -> str:
    """The socket path of ``unix:///path`` or ``/path``."""
    if endpoint.startswith("unix://"):
        path = endpoint.removeprefix("unix://")
    elif endpoint.startswith("/"):
        path = endpoint
    else:
        raise ConfigInvalid(
            f"runtime endpoint {endpoint!r} is not a unix socket; "
            "use unix:///var/run/crio/crio.sock or an absolute path"
        )
    if not path.startswith("/"):
        raise ConfigInvalid(f"runtime endpoint {endpoint!r} must be an absolute socket path")
    return path


def stored_image(msg: pb.Image) -> StoredImage:
    """Convert a CRI ``Image`` message (range-checked: ``answers.stored_image``)."""
    return answers.stored_image(msg)


def auth_config(credentials: RegistryCredentials) -> pb.AuthConfig:
    """Convert credentials into a CRI ``AuthConfig`` message."""
    return pb.AuthConfig(
        username=credentials.username,
        password=credentials.password,
        auth=credentials.auth,
        server_address=credentials.server_address,
        identity_token=credentials.identity_token,
        registry_token=credentials.registry_token,
    )


class CriClient:
    """Async CRI client for one runtime socket; implements ``nodeagent.ports.ImageRuntime``.

    ``timeout_s`` bounds every call except pulls, whose deadline is given per
    call (a pull of a large image is legitimately slow). A missing or dead
    socket fails at once with ``RuntimeUnreachable``: calls never wait for
    the runtime to appear. One connection, opened by the first call, carries
    every call; a broken one is replaced by the next call.
    """

    def __init__(self, endpoint: str, *, timeout_s: float = 30.0) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._channel = Channel(socket_path(endpoint), max_message_bytes=MAX_MESSAGE_BYTES)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> CriClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def version(self) -> RuntimeVersion:
        resp = await self._call(
            _RUNTIME + "Version",
            pb.VersionRequest(version=CRI_API_VERSION),
            pb.VersionResponse.FromString,
        )
        return answers.runtime_version(resp)

    async def list_containers(self) -> list[RunningContainer]:
        """The running containers (CRI ``ListContainers`` with state CONTAINER_RUNNING)."""
        running = pb.ContainerFilter(state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING))
        resp = await self._call(
            _RUNTIME + "ListContainers",
            pb.ListContainersRequest(filter=running),
            pb.ListContainersResponse.FromString,
        )
        return answers.running_containers(resp)

    async def list_images(self) -> list[StoredImage]:
        resp = await self._call(
            _IMAGE + "ListImages", pb.ListImagesRequest(), pb.ListImagesResponse.FromString
        )
        return answers.stored_images(resp)

    async def image_status(self, ref: str) -> StoredImage | None:
        """The stored image ``ref`` names, or None when the runtime does not have it."""
        resp = await self._call(
            _IMAGE + "ImageStatus",
            pb.ImageStatusRequest(image=pb.ImageSpec(image=ref)),
            pb.ImageStatusResponse.FromString,
        )
        return answers.stored_image(resp.image, "ImageStatus") if resp.HasField("image") else None

    async def pull_image(
        self,
        ref: str,
        credentials: RegistryCredentials | None = None,
        *,
        timeout_s: float | None = None,
    ) -> str:
        """Pull ``ref``; return the runtime's ``image_ref`` for it.

        CRI-O answers with the canonical ``repo@sha256:...`` name, containerd
        with the image id: callers that need the id ask ``image_status``.
        """
        request = pb.PullImageRequest(image=pb.ImageSpec(image=ref))
        if credentials is not None:
            request.auth.CopyFrom(auth_config(credentials))
        resp = await self._call(
            _IMAGE + "PullImage", request, pb.PullImageResponse.FromString, timeout_s=timeout_s
        )
        return answers.image_ref("PullImage", resp.image_ref)

    async def remove_image(self, ref: str) -> None:
        """Remove ``ref``; removing an absent image is not an error."""
        try:
            await self._call(
                _IMAGE + "RemoveImage",
                pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)),
                pb.RemoveImageResponse.FromString,
            )
        except ImageNotFound:
            return

    async def image_fs_info(self) -> list[FilesystemUsage]:
        resp = await self._call(
            _IMAGE + "ImageFsInfo", pb.ImageFsInfoRequest(), pb.ImageFsInfoResponse.FromString
        )
        return answers.filesystem_usages(resp)

    async def _call(
        self,
        method: str,
        request: _Req,
        decode: Callable[[bytes], _Resp],
        *,
        timeout_s: float | None = None,
    ) -> _Resp:
        deadline_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            data = await self._channel.unary(
                method, request.SerializeToString(), timeout_s=deadline_s
            )
        except RpcError as exc:
            error = classify_rpc_error(exc.code, exc.details)
            name = method.rsplit("/", 1)[-1]
            details = clip(exc.details, MAX_DETAILS_CHARS)
            raise error(f"{name} on {self.endpoint}: {details}") from exc
        try:
            return decode(data)
        except (DecodeError, RecursionError) as exc:
            name = method.rsplit("/", 1)[-1]
            raise RuntimeCallFailed(
                f"{name} on {self.endpoint}: bad response: {clip(exc, 200)}"
            ) from exc
