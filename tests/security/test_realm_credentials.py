"""Attack: a malicious registry names a token realm that harvests the pull secret.

Issue 24, finding 7. A registry answers 401 with ``WWW-Authenticate: Bearer realm=...``,
and the client asks that realm for a token, with the node's credentials for the registry
in HTTP basic form. The realm was taken as given, any host, even plain HTTP: a registry
(or a mirror, or whoever answers for an insecure one) could have the credentials sent in
clear text to a host of its choosing. containers/image does the same
(docs/runtime-facts.md); nodeagent now sends them only to an https realm (any host: Docker
Hub's and GitLab's are on other hosts than their registries), or to a plain-http realm on
the host of a registry registries.conf marks insecure.

Real parts: distribution's registry (``tests.testenv.registry``) with ``auth: token``, and
the token issuer of ``tests.testenv.token_issuer`` on another loopback address (127.0.0.2 is
another host than 127.0.0.1), recording the ``Authorization`` header of every request; the
one registry client (``adapters.registry.client``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.errors import RegistryAuthFailed
from nodeagent.ports import RegistryCredentials
from nodeagent.registries import Platform
from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.packages import ensure_packages
from tests.testenv.registry import Registry
from tests.testenv.token_issuer import TokenIssuer

USER, PASSWORD = "alice", "correct-horse"
GOOD = RegistryCredentials("registry", username=USER, password=PASSWORD)
AMD64 = Platform("linux", "amd64")
OTHER_HOST = "127.0.0.2"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> tuple[str, str]:
    """(repository, digest) of an image in the session registry's storage."""
    built = TestImage("realm-test/app", [LayerSpec(4096, 61)]).build()
    push(registry.url, built.repository, built)
    return built.repository, built.digest


def issuer(tmp: Path, *, host: str, tls: bool) -> TokenIssuer:
    ensure_packages()  # openssl makes and signs with the issuer's key
    return TokenIssuer(tmp, users={USER: PASSWORD}, host=host, tls=tls)


@pytest.fixture
def protected(tmp_path: Path, registry: Registry) -> Iterator[tuple[Registry, TokenIssuer]]:
    """A plain-http (insecure) registry whose realm is plain http on another host."""
    with (
        issuer(tmp_path / "issuer", host=OTHER_HOST, tls=False) as running,
        Registry(
            tmp_path / "reg", token_auth=running.config(), storage_root=registry.root
        ) as served,
    ):
        yield served, running


async def test_a_plain_http_realm_on_another_host_never_gets_the_credentials(
    protected: tuple[Registry, TokenIssuer], image: tuple[str, str]
) -> None:
    registry, token_issuer = protected
    repository, digest = image
    client = RegistryClient(insecure={registry.host}, timeout_s=10.0, platform=AMD64)
    with capture_logs() as logs, pytest.raises(RegistryAuthFailed):
        await client.image_layers(f"{registry.host}/{repository}@{digest}", GOOD)
    assert token_issuer.requests, "the realm was never asked"
    assert [r.authorization for r in token_issuer.requests] == [None] * len(
        token_issuer.requests
    )  # asked anonymously: the anonymous token grants nothing, the registry refuses it
    withheld = [e for e in logs if e["event"] == "registry_credentials_withheld"]
    assert len(withheld) == 1
    assert withheld[0]["realm"] == token_issuer.realm
    assert PASSWORD not in str(logs)


async def test_a_registry_over_https_cannot_downgrade_its_realm_to_plain_http(
    tmp_path: Path, registry: Registry, image: tuple[str, str]
) -> None:
    repository, digest = image
    with (
        issuer(tmp_path / "issuer", host="127.0.0.1", tls=False) as running,
        Registry(
            tmp_path / "reg", tls=True, token_auth=running.config(), storage_root=registry.root
        ) as served,
    ):
        client = RegistryClient(ca_file=served.ca_file, timeout_s=10.0, platform=AMD64)
        with pytest.raises(RegistryAuthFailed):
            await client.image_layers(f"{served.host}/{repository}@{digest}", GOOD)
        assert running.requests
        assert {r.authorization for r in running.requests} == {None}


async def test_an_https_realm_on_another_host_still_gets_them(
    tmp_path: Path, registry: Registry, image: tuple[str, str]
) -> None:
    """Docker Hub (registry-1.docker.io → auth.docker.io) and GitLab work this way."""
    repository, digest = image
    with (
        issuer(tmp_path / "issuer", host=OTHER_HOST, tls=True) as running,
        Registry(
            tmp_path / "reg", token_auth=running.config(), storage_root=registry.root
        ) as served,
    ):
        assert running.realm.startswith(f"https://{OTHER_HOST}:")
        assert running.tls_cert_path is not None
        client = RegistryClient(
            insecure={served.host}, ca_file=running.tls_cert_path, timeout_s=10.0, platform=AMD64
        )
        started = time.monotonic()
        layers = await client.image_layers(f"{served.host}/{repository}@{digest}", GOOD)
        assert layers.manifest_digest == digest
        assert [r.user for r in running.requests] == [USER]
        assert time.monotonic() - started < 10
