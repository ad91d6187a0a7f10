"""Integration tests: RegistryClient against real docker-registry processes.

The session registry (open, plain HTTP) holds the images; protected registries
(htpasswd basic auth, bearer tokens from tests/testenv/token_issuer.py, TLS)
serve the same storage, so images pushed through the open one are readable
through each of them.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.host import InsecureRegistries
from nodeagent.adapters.registry.cache import ManifestCache
from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.adapters.registry.mirrors import routes_of
from nodeagent.adapters.registry.tls import tls_context
from nodeagent.errors import ImageNotFound, RegistryAuthFailed, RegistryUnavailable
from nodeagent.ports import RegistryCredentials
from nodeagent.registries import Platform
from tests.conftest import Pushed
from tests.testenv.images import BuiltImage, LayerSpec, PushedImage, TestImage, push
from tests.testenv.packages import ensure_packages
from tests.testenv.registry import Registry, free_port, make_certificate
from tests.testenv.token_issuer import SERVICE, TokenIssuer

pytestmark = pytest.mark.integration

KIB = 1024
AMD64 = Platform("linux", "amd64")
ARM64 = Platform("linux", "arm64")
MISSING = "sha256:" + "0" * 64
USER, PASSWORD = "alice", "correct-horse"
GOOD = RegistryCredentials("registry", username=USER, password=PASSWORD)
WRONG = RegistryCredentials("registry", username=USER, password="wrong-battery")


def _client(
    registry: Registry,
    *,
    platform: Platform = AMD64,
    cache: ManifestCache | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RegistryClient:
    """A client that reaches ``registry`` over plain HTTP (marked insecure)."""
    return RegistryClient(
        insecure={registry.host}, timeout_s=10.0, platform=platform, cache=cache, clock=clock
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> tuple[BuiltImage, str]:
    """An image of three layers pushed to the session registry; (build, repository)."""
    layers = [LayerSpec(48 * KIB, 21), LayerSpec(16 * KIB, 22), LayerSpec(KIB, 23)]
    image = TestImage("client-test/app", layers).build()
    push(registry.url, image.repository, image)
    return image, image.repository


@pytest.fixture(scope="module")
def basic_registry(
    tmp_path_factory: pytest.TempPathFactory, registry: Registry
) -> Iterator[Registry]:
    workdir = tmp_path_factory.mktemp("basic-registry")
    users = {USER: PASSWORD}
    with Registry(workdir, htpasswd_users=users, storage_root=registry.root) as protected:
        yield protected


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenIssuer]:
    ensure_packages()  # openssl makes and signs with the issuer's key
    with TokenIssuer(tmp_path_factory.mktemp("issuer"), users={USER: PASSWORD}) as running:
        yield running


@pytest.fixture(scope="module")
def token_registry(
    tmp_path_factory: pytest.TempPathFactory, registry: Registry, issuer: TokenIssuer
) -> Iterator[Registry]:
    workdir = tmp_path_factory.mktemp("token-registry")
    with Registry(workdir, token_auth=issuer.config(), storage_root=registry.root) as protected:
        yield protected


@pytest.fixture(scope="module")
def tls_registry(
    tmp_path_factory: pytest.TempPathFactory, registry: Registry
) -> Iterator[Registry]:
    workdir = tmp_path_factory.mktemp("tls-registry")
    with Registry(workdir, tls=True, storage_root=registry.root) as secure:
        yield secure


def _ref(registry: Registry, image: BuiltImage | PushedImage, repository: str | None = None) -> str:
    return f"{registry.host}/{repository or image.repository}@{image.digest}"


def _expected_layers(image: BuiltImage) -> tuple[tuple[str, int], ...]:
    return tuple((layer.digest, layer.size_bytes) for layer in image.layers)


def _manifest_requests(registry: Registry, status: int) -> int:
    """Access-log lines of manifest GETs that the registry answered with ``status``."""
    lines = registry.log_path.read_text().splitlines()
    return sum(1 for line in lines if "/manifests/" in line and f'HTTP/1.1" {status} ' in line)


# ------------------------------------------------------------------------- open registry


async def test_sizes_equal_what_was_pushed(
    registry: Registry, built: tuple[BuiltImage, str]
) -> None:
    image, _ = built
    ref = _ref(registry, image)
    layers = await _client(registry).image_layers(ref)
    assert layers.ref == ref
    assert layers.manifest_digest == image.digest
    assert layers.config_size_bytes == image.config.size_bytes
    assert layers.layers == _expected_layers(image)
    assert layers.total_size_bytes == sum(blob.size_bytes for blob in image.blobs())


async def test_pushed_fixture_sizes_match(registry: Registry, pushed: Pushed) -> None:
    layers = await _client(registry).image_layers(pushed.ref(pushed.base_a))
    assert tuple(digest for digest, _ in layers.layers) == pushed.base_a.layer_digests
    assert layers.total_size_bytes == pushed.base_a.total_size_bytes


@pytest.mark.parametrize(("platform", "child"), [(AMD64, 0), (ARM64, 1)])
async def test_index_resolves_to_the_node_platform(
    registry: Registry, pushed: Pushed, platform: Platform, child: int
) -> None:
    client = _client(registry, platform=platform)
    layers = await client.image_layers(pushed.ref(pushed.multiarch))
    assert layers.manifest_digest == pushed.multiarch.child_digests[child]
    assert layers.manifest_digest != pushed.multiarch.digest
    assert len(layers.layers) == 1
    assert layers.layers[0][0] == pushed.multiarch.layer_digests[child]


async def test_index_without_the_node_platform_is_not_found(
    registry: Registry, pushed: Pushed
) -> None:
    client = _client(registry, platform=Platform("linux", "s390x"))
    with pytest.raises(ImageNotFound, match=r"no linux/s390x image"):
        await client.image_layers(pushed.ref(pushed.multiarch))


@pytest.mark.parametrize("repository", ["client-test/app", "client-test/no-such-repo"])
async def test_missing_manifest_is_not_found(
    registry: Registry, built: tuple[BuiltImage, str], repository: str
) -> None:
    ref = f"{registry.host}/{repository}@{MISSING}"
    with pytest.raises(ImageNotFound, match=ref):
        await _client(registry).image_layers(ref)


async def test_unreachable_port_fails_fast() -> None:
    host = f"127.0.0.1:{free_port()}"
    ref = f"{host}/app@{MISSING}"
    client = RegistryClient(insecure={host}, timeout_s=30.0)
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match=ref) as caught:
        await client.image_layers(ref)
    assert time.monotonic() - started < 2.0
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)


async def test_https_is_the_default_scheme(
    registry: Registry, built: tuple[BuiltImage, str]
) -> None:
    # Not marked insecure: a TLS handshake with a plain-HTTP registry must fail, not downgrade.
    client = RegistryClient(timeout_s=10.0)
    with pytest.raises(RegistryUnavailable, match="cannot reach"):
        await client.image_layers(_ref(registry, built[0]))


async def test_disk_cache_answers_without_the_registry(
    registry: Registry, pushed: Pushed, built: tuple[BuiltImage, str], tmp_path: Path
) -> None:
    cache_dir = tmp_path / "manifests"
    refs = [pushed.ref(pushed.multiarch), _ref(registry, built[0])]
    online = _client(registry, cache=ManifestCache(cache_dir))
    first = [await online.image_layers(ref) for ref in refs]
    assert len(list(cache_dir.glob("*.json"))) == 3  # index pick, its child, the image

    dead = f"127.0.0.1:{free_port()}"
    offline = RegistryClient(insecure={dead}, platform=AMD64, cache=ManifestCache(cache_dir))
    for ref, expected in zip(refs, first, strict=True):
        moved = ref.replace(registry.host, dead)
        again = await offline.image_layers(moved)
        assert (again.manifest_digest, again.layers) == (expected.manifest_digest, expected.layers)
        assert again.config_size_bytes == expected.config_size_bytes


# ------------------------------------------------------------------------- basic auth


async def test_basic_auth_with_the_right_credentials(
    basic_registry: Registry, built: tuple[BuiltImage, str], pushed: Pushed
) -> None:
    client = _client(basic_registry)
    layers = await client.image_layers(_ref(basic_registry, built[0]), GOOD)
    assert layers.layers == _expected_layers(built[0])
    challenged = _manifest_requests(basic_registry, 401)
    # The host is now known to want basic auth: the next image goes without a 401 first.
    other = await client.image_layers(_ref(basic_registry, pushed.base_b), GOOD)
    assert other.manifest_digest == pushed.base_b.digest
    assert _manifest_requests(basic_registry, 401) == challenged


async def test_basic_auth_from_the_raw_auth_field(
    basic_registry: Registry, built: tuple[BuiltImage, str]
) -> None:
    raw = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    credentials = RegistryCredentials("registry", auth=raw)
    layers = await _client(basic_registry).image_layers(_ref(basic_registry, built[0]), credentials)
    assert layers.manifest_digest == built[0].digest


@pytest.mark.parametrize("credentials", [WRONG, None], ids=["wrong", "none"])
async def test_basic_auth_refusals(
    basic_registry: Registry, built: tuple[BuiltImage, str], credentials: RegistryCredentials | None
) -> None:
    ref = _ref(basic_registry, built[0])
    with pytest.raises(RegistryAuthFailed, match=ref) as caught:
        await _client(basic_registry).image_layers(ref, credentials)
    assert "wrong-battery" not in str(caught.value)


# ------------------------------------------------------------------------- bearer tokens


async def test_bearer_token_is_fetched_once_and_reused(
    token_registry: Registry, issuer: TokenIssuer, built: tuple[BuiltImage, str]
) -> None:
    client = _client(token_registry)
    before = len(issuer.requests)
    layers = await client.image_layers(_ref(token_registry, built[0]), GOOD)
    assert layers.layers == _expected_layers(built[0])
    asked = issuer.requests[before:]
    assert [(r.user, r.scope, r.service) for r in asked] == [
        (USER, f"repository:{built[1]}:pull", SERVICE)
    ]
    # Same repository, another manifest: the cached token is sent up front.
    challenged = _manifest_requests(token_registry, 401)
    with pytest.raises(ImageNotFound):
        await client.image_layers(f"{token_registry.host}/{built[1]}@{MISSING}", GOOD)
    assert len(issuer.requests) == before + 1
    assert _manifest_requests(token_registry, 401) == challenged


async def test_expired_token_is_renewed(
    token_registry: Registry, issuer: TokenIssuer, built: tuple[BuiltImage, str]
) -> None:
    now = [1000.0]
    client = _client(token_registry, clock=lambda: now[0])
    missing = f"{token_registry.host}/{built[1]}@{MISSING}"
    before = len(issuer.requests)
    with pytest.raises(ImageNotFound):
        await client.image_layers(missing, GOOD)
    now[0] += issuer.lifetime_s  # past 90% of the token's lifetime
    with pytest.raises(ImageNotFound):
        await client.image_layers(missing, GOOD)
    assert len(issuer.requests) == before + 2


async def test_registry_token_is_sent_as_is(
    token_registry: Registry, issuer: TokenIssuer, built: tuple[BuiltImage, str]
) -> None:
    token = _token_from(issuer, f"repository:{built[1]}:pull")
    before = len(issuer.requests)
    credentials = RegistryCredentials("registry", registry_token=token)
    layers = await _client(token_registry).image_layers(_ref(token_registry, built[0]), credentials)
    assert layers.manifest_digest == built[0].digest
    assert len(issuer.requests) == before


@pytest.mark.parametrize(
    ("credentials", "issuer_status"), [(WRONG, 401), (None, 200)], ids=["wrong", "anonymous"]
)
async def test_bearer_refusals(
    token_registry: Registry,
    issuer: TokenIssuer,
    built: tuple[BuiltImage, str],
    credentials: RegistryCredentials | None,
    issuer_status: int,
) -> None:
    ref = _ref(token_registry, built[0])
    before = len(issuer.requests)
    with pytest.raises(RegistryAuthFailed, match=ref) as caught:
        await _client(token_registry).image_layers(ref, credentials)
    assert [r.status for r in issuer.requests[before:]] == [issuer_status]
    assert "wrong-battery" not in str(caught.value)


def _token_from(issuer: TokenIssuer, scope: str) -> str:
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    url = f"{issuer.realm}?service={SERVICE}&scope={scope}"
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {basic}"})  # noqa: S310 - loopback test issuer
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        token: str = json.load(response)["token"]
    return token


# ------------------------------------------------------------------------- TLS


async def test_tls_with_the_registry_ca(
    tls_registry: Registry, built: tuple[BuiltImage, str]
) -> None:
    client = RegistryClient(ca_file=tls_registry.ca_file, timeout_s=10.0, platform=AMD64)
    layers = await client.image_layers(_ref(tls_registry, built[0]))
    assert layers.layers == _expected_layers(built[0])


async def test_tls_with_an_unknown_ca_fails(
    tls_registry: Registry, built: tuple[BuiltImage, str]
) -> None:
    client = RegistryClient(timeout_s=10.0, platform=AMD64)
    with pytest.raises(RegistryUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        await client.image_layers(_ref(tls_registry, built[0]))


# ------------------------------------------------------------------------- integrity


async def test_tampered_manifest_is_refused(tmp_path: Path) -> None:
    # distribution serves stored manifest bytes without re-hashing them, so editing the
    # blob in its storage makes a real registry serve content that misses its digest.
    with Registry(tmp_path / "registry") as own:
        images = [TestImage("x/app", [LayerSpec(KIB, seed)]).build() for seed in (31, 32)]
        for image in images:
            push(own.url, image.repository, image)
        hex_digest = images[0].digest.removeprefix("sha256:")
        blob = own.root / f"docker/registry/v2/blobs/sha256/{hex_digest[:2]}/{hex_digest}/data"
        assert blob.read_bytes() == images[0].manifest.data
        assert images[1].manifest.data is not None
        blob.write_bytes(images[1].manifest.data)
        ref = _ref(own, images[0])
        client = _client(own, cache=ManifestCache(tmp_path / "cache"))
        with pytest.raises(RegistryUnavailable, match=f"{ref}: .*sha256 is not"):
            await client.image_layers(ref)
        assert not list((tmp_path / "cache").glob("*"))  # nothing unverified is remembered


async def test_corrupt_cache_entry_is_refetched(
    registry: Registry, built: tuple[BuiltImage, str], tmp_path: Path
) -> None:
    image, _ = built
    entry = tmp_path / "cache" / f"{image.digest.replace(':', '-')}.json"
    entry.parent.mkdir()
    entry.write_text('{"config_size_bytes": "not a number"')
    client = _client(registry, cache=ManifestCache(tmp_path / "cache"))
    layers = await client.image_layers(_ref(registry, image))
    assert layers.layers == _expected_layers(image)
    assert json.loads(entry.read_text())["config_size_bytes"] == image.config.size_bytes


async def test_registries_conf_edit_is_followed_without_a_restart(
    registry: Registry, built: tuple[BuiltImage, str], tmp_path: Path
) -> None:
    """The daemon's InsecureRegistries: a mirror marked insecure after start is reached over
    plain HTTP at the next look-up; a broken edit keeps what was read last."""
    image, repository = built
    conf, dropins = tmp_path / "registries.conf", tmp_path / "registries.conf.d"
    conf.write_text('unqualified-search-registries = ["registry.example.com"]\n')
    dropins.mkdir()
    insecure = InsecureRegistries(conf, dropins)
    client = RegistryClient(insecure=insecure, timeout_s=10.0, platform=AMD64)
    ref = _ref(registry, image, repository)
    with pytest.raises(RegistryUnavailable):  # HTTPS to a plain-HTTP registry
        await client.image_layers(ref)

    (dropins / "50-mirror.conf").write_text(
        f'[[registry]]\nlocation = "{registry.host}"\ninsecure = true\n'
    )
    layers = await client.image_layers(ref)
    assert layers.layers == _expected_layers(image)

    (dropins / "60-broken.conf").write_text("[[registry]\n")
    with capture_logs() as logs:
        assert insecure() == frozenset({registry.host})
    assert [entry["event"] for entry in logs] == ["registries_conf_invalid"]
    assert "60-broken.conf" in logs[0]["error"]

    (dropins / "60-broken.conf").unlink()
    (dropins / "50-mirror.conf").unlink()
    assert insecure() == frozenset()


def _hashed_ca_dir(directory: Path, *certificates: Path) -> Path:
    """A CA directory as the system keeps one: PEM files plus their subject-hash links."""
    directory.mkdir()
    for number, certificate in enumerate(certificates):
        (directory / f"ca-{number}.pem").write_bytes(certificate.read_bytes())
    subprocess.run(["openssl", "rehash", str(directory)], check=True, capture_output=True)
    return directory


async def test_system_cas_from_a_hashed_directory_verify_and_refuse(
    tls_registry: Registry,
    built: tuple[BuiltImage, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without ca_file, the system CAs come from a hashed directory, read on demand."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # as under systemd, which sets neither
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    trusting = _hashed_ca_dir(tmp_path / "trusting", tls_registry.ca_file)
    other_ca, _ = make_certificate(tmp_path / "other", "some other CA")
    foreign = _hashed_ca_dir(tmp_path / "foreign", other_ca)
    ref = _ref(tls_registry, built[0])

    client = RegistryClient(ca_dirs=(tmp_path / "missing", trusting), platform=AMD64)
    layers = await client.image_layers(ref)
    assert layers.layers == _expected_layers(built[0])

    refused = RegistryClient(ca_dirs=(foreign,), platform=AMD64)
    with pytest.raises(RegistryUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        await refused.image_layers(ref)


def test_system_cas_are_not_all_loaded_up_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # as under systemd, which sets neither
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    bundle, _ = make_certificate(tmp_path / "ca", "bundle CA")
    hashed = _hashed_ca_dir(tmp_path / "hashed", bundle)
    lazy = tls_context(None, (hashed,))
    assert lazy.cert_store_stats()["x509"] == 0  # nothing parsed before a chain needs it
    assert lazy.verify_mode == ssl.CERT_REQUIRED
    assert lazy.check_hostname
    # No hashed directory: OpenSSL's default bundle, parsed at once, as before.
    eager = tls_context(None, (tmp_path / "ca",))
    assert eager.cert_store_stats()["x509"] > 0
    # An administrator's SSL_CERT_FILE still wins.
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    assert tls_context(None, (hashed,)).cert_store_stats()["x509"] == 1


# ------------------------------------------------------------------------- mirrors


async def test_an_image_is_sized_through_its_registries_conf_mirror(
    registry: Registry, built: tuple[BuiltImage, str]
) -> None:
    """A disconnected site: the image's own registry is out of reach, its mirror is not."""
    image, repository = built
    dead = f"127.0.0.1:{free_port()}"
    conf = (
        f'[[registry]]\nlocation = "{dead}/mirrored"\n'
        f'[[registry.mirror]]\nlocation = "{registry.host}/client-test"\n'
    )
    client = RegistryClient(
        insecure={registry.host, dead},
        platform=AMD64,
        timeout_s=10.0,
        routes=lambda: routes_of([("registries.conf", conf)]),
    )
    ref = f"{dead}/mirrored/{repository.removeprefix('client-test/')}@{image.digest}"
    layers = await client.image_layers(ref)
    assert layers.ref == ref
    assert layers.layers == _expected_layers(image)


async def test_a_mirror_that_cannot_serve_falls_back_to_the_image_s_own_registry(
    registry: Registry, built: tuple[BuiltImage, str]
) -> None:
    image, _ = built
    dead = f"127.0.0.1:{free_port()}"
    conf = f'[[registry]]\nlocation = "{registry.host}"\n[[registry.mirror]]\nlocation = "{dead}"\n'
    client = RegistryClient(
        insecure={registry.host, dead},
        platform=AMD64,
        timeout_s=10.0,
        routes=lambda: routes_of([("registries.conf", conf)]),
    )
    layers = await client.image_layers(_ref(registry, image))
    assert layers.layers == _expected_layers(image)
    unknown = f"{registry.host}/client-test/none@{MISSING}"
    with pytest.raises(ImageNotFound):  # every source failed: the own registry's error
        await client.image_layers(unknown)
