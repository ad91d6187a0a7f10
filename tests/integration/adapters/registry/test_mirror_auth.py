"""Integration tests: a disconnected site, its mirror requiring credentials, the source dead.

The mirror is a real docker-registry with htpasswd basic auth over TLS, serving the session
registry's storage, its CA found only in a containers-certs.d(5) directory. The images keep
their source names under an address where nothing listens (or a socket that accepts and never
answers). Credentials come from a real auth file parsed by ``nodeagent.authfile``, keyed by
the host each look-up goes to.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.crio_config import CrioDropins
from nodeagent.adapters.host import RuntimeAuthFile, first_credentials
from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.adapters.registry.mirrors import routes_of
from nodeagent.authfile import AuthStore, parse_auth_file
from nodeagent.errors import RegistryUnavailable
from nodeagent.ports import RegistryCredentials
from nodeagent.registries import Platform
from tests.testenv.images import BuiltImage, LayerSpec, TestImage, push
from tests.testenv.registry import Registry, free_port

pytestmark = pytest.mark.integration

KIB = 1024
USER, PASSWORD = "mirror-user", "mirror-password"


@pytest.fixture(scope="module")
def image(registry: Registry) -> BuiltImage:
    built = TestImage("mirror-auth/app", [LayerSpec(8 * KIB, 31), LayerSpec(KIB, 32)]).build()
    push(registry.url, built.repository, built)
    return built


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Registry]:
    workdir = tmp_path_factory.mktemp("mirror")
    users = {USER: PASSWORD}
    with Registry(workdir, htpasswd_users=users, tls=True, storage_root=registry.root) as running:
        yield running


@pytest.fixture(scope="module")
def certs_d(tmp_path_factory: pytest.TempPathFactory, mirror: Registry) -> Path:
    """``certs.d/<mirror host:port>/ca.crt``, as an admin (or the MCO) lays it out."""
    root = tmp_path_factory.mktemp("certs.d")
    (root / mirror.host).mkdir()
    (root / mirror.host / "ca.crt").write_bytes(mirror.ca_file.read_bytes())
    return root


@pytest.fixture
def silent() -> Iterator[str]:
    """A loopback address that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


def _auth(host: str) -> AuthStore:
    entry = {"username": USER, "password": PASSWORD}
    return parse_auth_file(json.dumps({"auths": {host: entry}}), source="auth.json")


def _client(
    source: str,
    mirror: Registry,
    auth: AuthStore | Callable[[str], RegistryCredentials | None],
    timeout_s: float,
    certs_d: Path | None,
) -> RegistryClient:
    conf = (
        f'[[registry]]\nlocation = "{source}/mirrored"\n'
        f'[[registry.mirror]]\nlocation = "{mirror.host}/mirror-auth"\n'
    )
    return RegistryClient(
        insecure={source},
        platform=Platform("linux", "amd64"),
        timeout_s=timeout_s,
        routes=lambda: routes_of([("registries.conf", conf)]),
        credentials_for=auth.credentials_for if isinstance(auth, AuthStore) else auth,
        certs_dirs=(certs_d,) if certs_d else (),
    )


async def test_the_mirror_is_read_with_the_mirror_host_s_credentials(
    mirror: Registry, image: BuiltImage, certs_d: Path
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    ref = f"{dead}/mirrored/app@{image.digest}"
    auth = _auth(mirror.host)
    client = _client(dead, mirror, auth, 10.0, certs_d)
    layers = await client.image_layers(ref, auth.credentials_for(ref))  # None: no entry for dead
    assert layers.ref == ref
    assert layers.layers == tuple((layer.digest, layer.size_bytes) for layer in image.layers)


async def test_without_its_certs_d_ca_the_mirror_is_not_trusted(
    mirror: Registry, image: BuiltImage
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    ref = f"{dead}/mirrored/app@{image.digest}"
    client = _client(dead, mirror, _auth(mirror.host), 10.0, None)
    with capture_logs() as logs, pytest.raises(RegistryUnavailable):
        await client.image_layers(ref)
    skipped = [entry for entry in logs if entry["event"] == "mirror_unusable"]
    assert len(skipped) == 1 and skipped[0]["reason"] == "RegistryUnavailable"


async def test_the_source_host_s_credentials_do_not_open_the_mirror(
    mirror: Registry, image: BuiltImage, certs_d: Path
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    ref = f"{dead}/mirrored/app@{image.digest}"
    auth = _auth(dead)  # the entry names the source, which CRI-O never reaches
    client = _client(dead, mirror, auth, 10.0, certs_d)
    with pytest.raises(RegistryUnavailable, match="cannot reach"):
        await client.image_layers(ref, auth.credentials_for(ref))
    log = mirror.log_path.read_text()
    assert '"GET /v2/mirror-auth/app/manifests/' in log  # the mirror was asked, and refused


async def test_a_silent_source_costs_one_timeout_per_sync_not_one_per_image(
    mirror: Registry, image: BuiltImage, silent: str, certs_d: Path
) -> None:
    refs = [f"{silent}/elsewhere/app-{n}@{image.digest}" for n in range(4)]
    client = _client(silent, mirror, _auth(mirror.host), 1.0, certs_d)
    took: list[float] = []
    messages: list[str] = []
    for ref in refs:
        started = time.monotonic()
        with pytest.raises(RegistryUnavailable) as caught:
            await client.image_layers(ref)
        took.append(time.monotonic() - started)
        messages.append(caught.value.message)
    assert took[0] >= 0.9  # the first look-up waited out its timeout
    assert max(took[1:]) < 0.2, took  # the others were answered from memory
    assert all(ref in message for ref, message in zip(refs, messages, strict=True))
    assert all("could not be reached" in message for message in messages[1:])
    assert "timed out" in messages[1]  # the first failure's reason, carried on

    client.unreachable.forget()  # a new sync asks again
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable):
        await client.image_layers(refs[0])
    assert time.monotonic() - started >= 0.9


async def test_a_silent_mirror_is_skipped_after_its_first_timeout(
    registry: Registry, mirror: Registry, image: BuiltImage, silent: str
) -> None:
    """The mirror does not answer, the source (the open session registry) does."""
    conf = (
        f'[[registry]]\nlocation = "{registry.host}/mirror-auth"\n'
        f'[[registry.mirror]]\nlocation = "{silent}/mirror-auth"\n'
    )
    client = RegistryClient(
        insecure={registry.host, silent},
        platform=Platform("linux", "amd64"),
        timeout_s=1.0,
        routes=lambda: routes_of([("registries.conf", conf)]),
    )
    ref = f"{registry.host}/mirror-auth/app@{image.digest}"
    started = time.monotonic()
    assert (await client.image_layers(ref)).ref == ref
    assert time.monotonic() - started >= 0.9
    client.cache = type(client.cache)()  # an empty cache: the next look-up goes out again
    started = time.monotonic()
    assert (await client.image_layers(ref)).ref == ref
    assert time.monotonic() - started < 0.5


async def test_crio_s_global_auth_file_opens_the_mirror_where_nodeagent_s_has_no_entry(
    mirror: Registry, image: BuiltImage, certs_d: Path, tmp_path: Path
) -> None:
    """nodeagent's own auth file knows only another registry; CRI-O's configuration names a
    global auth file holding the mirror's entry: the look-up goes through with that entry."""
    crio_auth = tmp_path / "crio-auth.json"
    entry = {"username": USER, "password": PASSWORD}
    crio_auth.write_text(json.dumps({"auths": {mirror.host: entry}}))
    config_dir = tmp_path / "crio.conf.d"
    config_dir.mkdir()
    (tmp_path / "crio.conf").write_text('[crio.image]\nglobal_auth_file = "/nonexistent"\n')
    (config_dir / "10-auth.conf").write_text(f'[crio.image]\nglobal_auth_file = "{crio_auth}"\n')
    dropins = CrioDropins(tmp_path / "crio.conf", config_dir, tmp_path / "run", "99-nodeagent.conf")
    assert dropins.global_auth_file() == crio_auth  # the last file that sets it
    runtime_auth = RuntimeAuthFile(dropins.global_auth_file)
    own = _auth("registry.example.com")
    dead = f"127.0.0.1:{free_port()}"
    ref = f"{dead}/mirrored/app@{image.digest}"

    alone = _client(dead, mirror, own, 10.0, certs_d)
    with pytest.raises(RegistryUnavailable):  # the mirror refuses, the source is dead
        await alone.image_layers(ref)

    runtime_auth.refresh()
    both = first_credentials(own.credentials_for, runtime_auth.credentials_for)
    client = _client(dead, mirror, both, 10.0, certs_d)
    layers = await client.image_layers(ref, both(ref))
    assert layers.layers == tuple((layer.digest, layer.size_bytes) for layer in image.layers)

    (config_dir / "10-auth.conf").unlink()  # CRI-O's file is now /nonexistent: no entry at all
    runtime_auth.refresh()
    assert runtime_auth.credentials_for(f"{mirror.host}/mirror-auth/app@{image.digest}") is None
