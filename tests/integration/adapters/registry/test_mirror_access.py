"""A disconnected site for every path that reads registries itself: ``bundle create``, the node
store's registry sets and disk sizing, all built by ``adapters.registry.access`` from one
nodeagent configuration.

The images keep their source names under an address where nothing listens. Their mirror
(registries.conf.d, as an ImageDigestMirrorSet renders it) is a real docker-registry over TLS
that requires basic-auth credentials and a client certificate (distribution's
``http.tls.clientcas``). Its CA and the client certificate and key are found only in a
containers-certs.d(5) directory (``[runtime] certs_dirs``); its credentials only in the file
CRI-O's configuration names (``global_auth_file`` in ``crio.conf.d/00-default``, the drop-in
the machine-config-operator writes); nodeagent's own auth file has no entry for it.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.host import AuthFile
from nodeagent.adapters.registry.access import RegistryAccess, registry_access
from nodeagent.adapters.store.copier import StoreLimits
from nodeagent.adapters.store.records import StoreRecords
from nodeagent.adapters.store.registry_sets import RegistrySets
from nodeagent.bundles import minisign
from nodeagent.cli import main as cli
from nodeagent.config import load_config
from nodeagent.errors import RegistryUnavailable
from nodeagent.registries import Platform
from nodeagent.sync.copies import SetImages
from tests.conftest import Pushed
from tests.testenv.pki import Authority
from tests.testenv.registry import Registry, free_port

pytestmark = pytest.mark.integration

AMD64 = Platform("linux", "amd64")
USER, PASSWORD = "mirror-reader", "mirror-s3cret"


@dataclass(frozen=True)
class ClientFiles:
    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class Site:
    """One node's files: nodeagent's config and what it points at."""

    config_file: Path
    dead: str
    host_certs: Path
    """``<certs.d>/<mirror host:port>/``."""

    def ref(self, pushed: Pushed, image: str) -> str:
        return str(getattr(pushed, image).reference(self.dead))

    def access(self) -> RegistryAccess:
        config = load_config(self.config_file)
        own = AuthFile(config.pull.auth_file).credentials_for
        return registry_access(config.runtime, own, platform=AMD64, timeout_s=10.0)


@pytest.fixture(scope="module")
def client_files(tmp_path_factory: pytest.TempPathFactory) -> ClientFiles:
    authority = Authority("nodeagent-test mirror client CA")
    directory = tmp_path_factory.mktemp("client")
    files = ClientFiles(directory / "ca.pem", directory / "client.cert", directory / "client.key")
    files.ca.write_bytes(authority.cert_pem)
    authority.client("mirror-reader").write_pair(files.cert, files.key)
    return files


@pytest.fixture(scope="module")
def mirror(
    tmp_path_factory: pytest.TempPathFactory, registry: Registry, client_files: ClientFiles
) -> Iterator[Registry]:
    with Registry(
        tmp_path_factory.mktemp("mirror"),
        htpasswd_users={USER: PASSWORD},
        tls=True,
        client_ca=client_files.ca,
        client_pair=(client_files.cert, client_files.key),
        storage_root=registry.root,
    ) as running:
        yield running


def lay_out_site(base: Path, mirror: Registry, client: ClientFiles) -> Site:
    dead = f"127.0.0.1:{free_port()}"
    containers, crio = base / "etc" / "containers", base / "etc" / "crio"
    (containers / "registries.conf.d").mkdir(parents=True)
    (crio / "crio.conf.d").mkdir(parents=True)
    (containers / "registries.conf").write_text("unqualified-search-registries = []\n")
    (containers / "registries.conf.d" / "99-idms.conf").write_text(
        # as the MCO renders an ImageDigestMirrorSet: the policy per mirror only (the
        # registry-wide mirror-by-digest-only beside it is refused by containers/image)
        f'[[registry]]\nprefix = ""\nlocation = "{dead}"\n'
        f'[[registry.mirror]]\nlocation = "{mirror.host}"\npull-from-mirror = "digest-only"\n'
    )
    crio_auth = base / "kubelet-config.json"
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    crio_auth.write_text(json.dumps({"auths": {mirror.host: {"auth": token}}}))
    (crio / "crio.conf.d" / "00-default").write_text(
        f'[crio.image]\nglobal_auth_file = "{crio_auth}"\n'
    )
    own_auth = base / "nodeagent-auth.json"
    own_auth.write_text(json.dumps({"auths": {"registry.example.com": {"auth": "eDp5"}}}))
    host_certs = base / "certs.d" / mirror.host
    host_certs.mkdir(parents=True)
    shutil.copy(mirror.ca_file, host_certs / "ca.crt")
    shutil.copy(client.cert, host_certs / "client.cert")
    shutil.copy(client.key, host_certs / "client.key")
    config_file = base / "nodeagent.toml"
    config_file.write_text(
        f'[runtime]\nconfig_file = "{crio}/crio.conf"\nconfig_dir = "{crio}/crio.conf.d"\n'
        f'registries_conf = "{containers}/registries.conf"\n'
        f'registries_dir = "{containers}/registries.conf.d"\n'
        f'certs_dirs = ["{base}/certs.d"]\n'
        f'[pull]\nauth_file = "{own_auth}"\n'
    )
    return Site(config_file, dead, host_certs)


@pytest.fixture
def site(tmp_path: Path, mirror: Registry, client_files: ClientFiles) -> Site:
    return lay_out_site(tmp_path / "node", mirror, client_files)


def run_cli(*args: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main([str(arg) for arg in args])
    return code, out.getvalue(), err.getvalue()


def test_bundle_create_reads_through_the_mirror_with_crio_s_credentials_and_certs_d(
    site: Site, mirror: Registry, pushed: Pushed, tmp_path: Path
) -> None:
    public_text, secret_text = minisign.generate_keypair(comment="mirror test")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "k.pub").write_text(public_text)
    (tmp_path / "k.key").write_text(secret_text)
    refs = [site.ref(pushed, "base_a"), site.ref(pushed, "multiarch")]
    output = tmp_path / "bundle"
    code, out, err = run_cli(
        "--config", site.config_file, "bundle", "create", "--image", *refs,
        "--key", tmp_path / "k.key", "--output", output, "--arch", "amd64",
    )  # fmt: skip
    assert code == 0, err
    assert all(ref in out for ref in refs)  # the bundle keeps the images' own names
    code, _, err = run_cli(
        "--config", site.config_file, "bundle", "verify", output,
        "--trusted-keys", tmp_path / "keys",
    )  # fmt: skip
    assert code == 0, err
    served = [line for line in mirror.log_path.read_text().splitlines() if "/blobs/" in line]
    assert any('HTTP/1.1" 200 ' in line for line in served)
    assert PASSWORD not in out + err


async def test_a_registry_set_is_stored_through_the_mirror(
    site: Site, pushed: Pushed, tmp_path: Path
) -> None:
    access = site.access()
    store = tmp_path / "store"
    refs = (site.ref(pushed, "base_a"), site.ref(pushed, "base_b"))
    sets = RegistrySets(
        store, access.client, access.credentials_for, AMD64, StoreLimits(), clock=lambda: 1.0
    )
    outcome = await sets.store([SetImages("mirrored", refs, refs, ())], None)
    assert outcome.failures == ()
    assert sorted(outcome.refs) == sorted(refs)
    (record,) = StoreRecords(store).load().records
    assert record.is_registry and len(record.blobs) >= 6  # two manifests, configs, layers


async def test_disk_sizing_reads_the_mirror_and_remembers_the_dead_source(
    site: Site, pushed: Pushed
) -> None:
    access = site.access()
    ref = site.ref(pushed, "base_b")
    layers = await access.client.image_layers(ref, access.credentials_for(ref))
    assert layers.ref == ref and len(layers.layers) == 2
    (site.host_certs / "ca.crt").unlink()  # the mirror's TLS is no longer trusted
    access.client.cache = type(access.client.cache)()
    for attempt in range(2):
        with capture_logs() as logs, pytest.raises(RegistryUnavailable) as caught:
            await access.client.image_layers(ref)
        reasons = [e["reason"] for e in logs if e["event"] == "mirror_unusable"]
        assert reasons == ["RegistryUnavailable"], reasons
        if attempt:  # the second sizing: both hosts answered from memory, no new timeout
            assert "could not be reached" in caught.value.message


@pytest.mark.parametrize(
    ("removed", "reason"),
    [
        (("client.cert", "client.key"), "RegistryUnavailable"),  # the mirror refuses the TLS
        (("client.key",), "RegistryCertsInvalid"),  # half a pair: never sent
        (("client.cert",), "RegistryCertsInvalid"),
    ],
)
async def test_the_mirror_needs_the_client_certificate_and_half_a_pair_is_a_reason(
    site: Site, pushed: Pushed, mirror: Registry, removed: tuple[str, ...], reason: str
) -> None:
    for name in removed:
        (site.host_certs / name).unlink()
    access = site.access()
    ref = site.ref(pushed, "base_a")
    with capture_logs() as logs, pytest.raises(RegistryUnavailable, match="cannot reach"):
        await access.client.image_layers(ref)
    (skipped,) = [e for e in logs if e["event"] == "mirror_unusable"]
    assert skipped["reason"] == reason
