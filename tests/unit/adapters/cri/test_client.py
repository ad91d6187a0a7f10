"""Pure parts of the CRI adapter: error classification, endpoints, message conversion."""

from __future__ import annotations

import pytest

from nodeagent import errors
from nodeagent.adapters.cri import client as cri
from nodeagent.adapters.cri.api import runtime_v1_pb2 as pb
from nodeagent.adapters.cri.client import StatusCode
from nodeagent.ports import RegistryCredentials

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("code", "details", "expected"),
    [
        (
            StatusCode.UNAVAILABLE,
            "failed to connect to all addresses",
            errors.RuntimeUnreachable,
        ),
        (StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", errors.RuntimeTimeout),
        (
            StatusCode.UNKNOWN,
            f"reading manifest {DIGEST} in 127.0.0.1:5000/app: manifest unknown",
            errors.ImageNotFound,
        ),
        (StatusCode.NOT_FOUND, "image not known", errors.ImageNotFound),
        (
            StatusCode.UNKNOWN,
            "initializing source: reading manifest: unauthorized: authentication required",
            errors.RegistryAuthFailed,
        ),
        (
            StatusCode.UNKNOWN,
            "writing blob: storing blob to file: write /var/lib/x: no space left on device",
            errors.NoSpaceLeft,
        ),
        (
            StatusCode.UNKNOWN,
            "pinging container registry 10.0.0.1:5000: dial tcp: connect: connection refused",
            errors.RegistryUnavailable,
        ),
        # Texts CRI-O 1.34.0 returned for a registry behind tests/testenv/faulty_proxy.py:
        (
            StatusCode.UNKNOWN,
            "unable to try pulling possible OCI artifact: build image source: pinging container "
            "registry 127.0.0.1:57171: received unexpected HTTP status: 500 Internal Server Error",
            errors.RegistryError,
        ),
        (
            StatusCode.UNKNOWN,
            "parsing image configuration: fetching blob: received unexpected HTTP status: "
            "503 Service Unavailable",
            errors.RegistryError,
        ),
        (
            StatusCode.UNKNOWN,
            f"reading manifest {DIGEST} in 127.0.0.1:57171/explore/x1: received unexpected "
            "HTTP status: 502 Bad Gateway",
            errors.RegistryError,
        ),
        (
            StatusCode.UNKNOWN,
            'pinging container registry 127.0.0.1:57171: Get "http://127.0.0.1:57171/v2/": '
            "read tcp 127.0.0.1:42704->127.0.0.1:57171: read: connection reset by peer",
            errors.RegistryUnavailable,
        ),
        (
            StatusCode.UNKNOWN,
            "fetching blob: received unexpected HTTP status: 429 Too Many Requests",
            errors.RegistryUnavailable,
        ),
        (
            StatusCode.UNKNOWN,
            "dial tcp: lookup r.example: no such host",
            errors.RegistryUnavailable,
        ),
        (
            StatusCode.UNKNOWN,
            'writing blob: storing blob to file "/var/tmp/container_images_storage3838301455/1": '
            "happened during read: context canceled",
            errors.PullStalled,
        ),
        (StatusCode.UNKNOWN, "something odd", errors.RuntimeCallFailed),
        (
            StatusCode.UNKNOWN,
            "received unexpected HTTP status: 418 I'm a teapot",
            errors.RuntimeCallFailed,
        ),
        (StatusCode.INVALID_ARGUMENT, "bad reference", errors.RuntimeCallFailed),
        # An unreachable runtime is unreachable whatever its error text says.
        (StatusCode.UNAVAILABLE, "no space left on device", errors.RuntimeUnreachable),
    ],
)
def test_classify_rpc_error(
    code: StatusCode, details: str, expected: type[errors.NodeAgentError]
) -> None:
    assert cri.classify_rpc_error(code, details) is expected


def test_no_space_wins_over_registry_noise() -> None:
    details = "copying blob: unexpected EOF: write: no space left on device"
    assert cri.classify_rpc_error(StatusCode.UNKNOWN, details) is errors.NoSpaceLeft


@pytest.mark.parametrize(
    ("endpoint", "path"),
    [
        ("unix:///var/run/crio/crio.sock", "/var/run/crio/crio.sock"),
        ("/run/crio.sock", "/run/crio.sock"),
    ],
)
def test_socket_path(endpoint: str, path: str) -> None:
    assert cri.socket_path(endpoint) == path


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:10010", "unix://relative.sock", "crio.sock"])
def test_socket_path_rejects(endpoint: str) -> None:
    with pytest.raises(errors.ConfigInvalid) as info:
        cri.socket_path(endpoint)
    assert endpoint in str(info.value)
    assert info.value.reason == "ConfigInvalid"


def test_stored_image_conversion() -> None:
    msg = pb.Image(
        id="abc",
        repo_tags=["quay.io/a/b:1"],
        repo_digests=[f"quay.io/a/b@{DIGEST}"],
        size=1234,
        pinned=True,
    )
    image = cri.stored_image(msg)
    assert image.id == "abc"
    assert image.size_bytes == 1234
    assert image.is_pinned is True
    assert image.names() == ("quay.io/a/b:1", f"quay.io/a/b@{DIGEST}")


def test_auth_config_carries_every_field_and_repr_hides_secrets() -> None:
    creds = RegistryCredentials(
        server_address="quay.io",
        username="u",
        password="hunter2",
        auth="dTpodW50ZXIy",
        identity_token="idtok",
        registry_token="regtok",
    )
    msg = cri.auth_config(creds)
    assert (msg.username, msg.password, msg.server_address) == ("u", "hunter2", "quay.io")
    assert (msg.auth, msg.identity_token, msg.registry_token) == ("dTpodW50ZXIy", "idtok", "regtok")
    shown = repr(creds)
    for secret in ("hunter2", "dTpodW50ZXIy", "idtok", "regtok"):
        assert secret not in shown
    assert "quay.io" in shown


def test_error_tree_reasons_are_unique_and_retry_branches() -> None:
    leaves: list[type[errors.NodeAgentError]] = [
        errors.RuntimeUnreachable,
        errors.RuntimeTimeout,
        errors.RegistryUnavailable,
        errors.ImageNotFound,
        errors.RegistryAuthFailed,
        errors.NoSpaceLeft,
        errors.RuntimeCallFailed,
        errors.ConfigInvalid,
    ]
    assert len({cls.reason for cls in leaves}) == len(leaves)
    err = errors.RuntimeUnreachable("socket gone")
    assert isinstance(err, errors.TransientError)
    assert err.retry_after_s == 2.0
    assert str(err) == "RuntimeUnreachable: socket gone"
    assert errors.TransientError("x", retry_after_s=7).retry_after_s == 7
    assert not isinstance(errors.NoSpaceLeft("full"), errors.TransientError)
