"""check-offline on the signatures a bundle carried, against a real CRI-O and a real import:
``SigstoreAttachmentsOff`` while registries.d does not make CRI-O read them, gone once it
does; ``RegistriesDInvalid`` when containers/image would refuse the directory;
``SignaturesRequired`` only for the image whose stored signature the node lost.

Real parts: a distribution registry with two images signed by a test key
(tests/testenv/sigstore.py), ``nodeagent bundle create --with-signatures``, the registry
stopped, ``nodeagent bundle import`` into a CRI-O whose policy.json requires sigstore
signatures for that registry, then ``nodeagent check-offline --json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.bundles import minisign
from nodeagent.offline import findings as f
from tests.testenv.agent import Agent
from tests.testenv.bundles import make_bundle
from tests.testenv.crio import Crio
from tests.testenv.registry import Registry
from tests.testenv.sigstore import SigningKey, push_signed_images

pytestmark = pytest.mark.integration

SIGSTORE_REASONS = {f.SIGSTORE_ATTACHMENTS_OFF, f.REGISTRIES_D_INVALID, f.SIGNATURES_REQUIRED}


@dataclass(frozen=True)
class Signed:
    bundle: Path
    refs: list[str]
    host: str
    minisign_public: str
    key: SigningKey
    signature_digests: dict[str, str]


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Signed:
    """Two images signed in a registry and bundled with their signatures; the registry is
    stopped before the test imports the bundle."""
    workdir = tmp_path_factory.mktemp("offline-sigstore")
    public, secret = minisign.generate_keypair(comment="offline sigstore test")
    key = SigningKey()
    with Registry(workdir / "registry") as registry:
        refs, digests = push_signed_images(
            registry, key, count=2, layer_bytes=64 << 10, base_bytes=64 << 10, seed=1616
        )
        bundle = make_bundle(workdir, registry, refs, public, secret,
                             extra_args=["--with-signatures"])  # fmt: skip
        host = registry.host
    return Signed(bundle, refs, host, public, key, digests)


def node(base: Path, crio: Crio, signed: Signed) -> Agent:
    """An agent whose drill reads CRI-O's own policy.json and a safe kubelet configuration."""
    kubelet = base / "etc/kubernetes/kubelet.conf"
    kubelet.parent.mkdir(parents=True)
    kubelet.write_text(
        "kind: KubeletConfiguration\nimagePullCredentialsVerificationPolicy: NeverVerify\n"
    )
    offline = (
        "[offline]\n"
        f'kubelet_config_files = ["{kubelet}"]\n'
        f'static_pod_dir = "{base / "etc/kubernetes/manifests"}"\n'
        f'signature_policy = "{crio.base / "etc/policy.json"}"\n'
    )
    agent = Agent(base / "agent", crio, extra_config=offline)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(signed.minisign_public)
    return agent


def sigstore_findings(agent: Agent) -> set[tuple[str, str]]:
    done = agent.cli("check-offline", "--json")
    assert done.returncode in (0, 1), done.stdout + done.stderr
    doc = json.loads(done.stdout)
    return {
        (item["reason"], item.get("subject", ""))
        for item in doc["findings"]
        if item["reason"] in SIGSTORE_REASONS
    }


def test_each_signature_condition_is_found_and_cleared(signed: Signed, tmp_path: Path) -> None:
    key_file = signed.key.write_public(tmp_path / "keys" / "sigstore.pub")
    required = [{"type": "sigstoreSigned", "keyPath": str(key_file),
                 "signedIdentity": {"type": "matchRepository"}}]  # fmt: skip
    policy = {
        "default": [{"type": "insecureAcceptAnything"}],
        "transports": {"docker": {signed.host: required}},
    }
    a, b = signed.refs
    with Crio(tmp_path / "crio", insecure_registries=[signed.host], policy=policy) as crio:
        agent = node(tmp_path, crio, signed)
        done = agent.cli("bundle", "import", str(signed.bundle), "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        directory = crio.registries_d_dir

        # no registries.d entry: CRI-O would never read the carried signatures
        assert sigstore_findings(agent) == {
            (f.SIGSTORE_ATTACHMENTS_OFF, a),
            (f.SIGSTORE_ATTACHMENTS_OFF, b),
        }

        # the entry for the registry: nothing left to say
        (directory / "50-test.yaml").write_text(
            f"docker:\n  {signed.host}:\n    use-sigstore-attachments: true\n"
        )
        assert sigstore_findings(agent) == set()

        # two files set default-docker: containers/image refuses the whole directory
        (directory / "60-a.yaml").write_text("default-docker:\n  sigstore-staging: file:///x\n")
        (directory / "61-b.yaml").write_text("default-docker:\n  sigstore-staging: file:///y\n")
        assert sigstore_findings(agent) == {(f.REGISTRIES_D_INVALID, str(directory))}
        (directory / "61-b.yaml").unlink()
        assert sigstore_findings(agent) == set()

        # the store loses the signature manifest of one image: only it lacks its signature
        store = agent.base / "state" / "store"
        lost = store / "blobs/sha256" / signed.signature_digests[a].removeprefix("sha256:")
        lost.unlink()
        assert sigstore_findings(agent) == {(f.SIGNATURES_REQUIRED, a)}
