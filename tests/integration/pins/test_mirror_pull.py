"""A disconnected site through the real CRI-O: the images' own registry is unreachable, their
mirror (registries.conf.d) requires credentials that only CRI-O's ``global_auth_file`` holds;
in the second test it also speaks mutual TLS with a private CA found only in certs.d.

nodeagent's own auth file has no entry for the mirror: its disk sizing takes the entry from
the file CRI-O's configuration names, and its pulls pass no credentials, so CRI-O
authenticates the mirror from that same file.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

from tests.conftest import Pushed
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.pki import Authority
from tests.testenv.registry import Registry, free_port

USER, PASSWORD = "mirror-reader", "mirror-s3cret"


def pinned_with_no_credentials_of_its_own(tmp_path: Path, crio: Crio, name: str, ref: str) -> Agent:
    """A daemon whose auth file is empty pins set ``name`` of ``ref``: what it reads of the
    mirror comes from CRI-O's files (global_auth_file, certs.d) alone."""
    agent = Agent(tmp_path / "agent", crio)
    agent.write_config()
    agent.auth_file.write_text(json.dumps({"auths": {}}))
    agent.write_set(name, [ref])
    with agent:
        agent.wait_status(lambda s: set_state(s, name) == "Pinned", what=f"{name} pinned")
    return agent


async def test_pinned_through_a_credentialed_mirror_with_the_source_unreachable(
    registry: Registry, pushed: Pushed, tmp_path: Path
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    ref = pushed.base_a.reference(dead)
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    with Registry(
        tmp_path / "mirror", htpasswd_users={USER: PASSWORD}, storage_root=registry.root
    ) as mirror:
        crio_auth = tmp_path / "crio-auth.json"
        crio_auth.write_text(json.dumps({"auths": {mirror.host: {"auth": token}}}))
        with Crio(
            tmp_path / "crio",
            insecure_registries=[mirror.host, dead],
            image_settings=f'global_auth_file = "{crio_auth}"',
        ) as crio:
            (crio.registries_dir / "50-mirror.conf").write_text(
                f'[[registry]]\nlocation = "{dead}"\ninsecure = true\n'
                f'[[registry.mirror]]\nlocation = "{mirror.host}"\ninsecure = true\n'
            )
            crio.reload()
            agent = pinned_with_no_credentials_of_its_own(tmp_path, crio, "mirrored", ref)
        lines = mirror.log_path.read_text().splitlines()
    served = [line for line in lines if "/manifests/" in line and 'HTTP/1.1" 200 ' in line]
    assert served  # the mirror served the manifests (to nodeagent's sizing and to CRI-O)
    log = agent.log_text()
    assert PASSWORD not in log and token not in log


async def test_pinned_through_a_mutual_tls_mirror_whose_ca_and_client_pair_only_certs_d_holds(
    registry: Registry, pushed: Pushed, tmp_path: Path
) -> None:
    """The mirror speaks TLS with a private CA and requires a client certificate; both CRI-O
    and nodeagent find the CA, the client certificate and its key only in the runtime's
    containers-certs.d(5) directory (``Crio.certs_d_dir``, ``[runtime] certs_dirs``), and the
    mirror's credentials only in the file CRI-O's ``crio.conf.d/00-default`` names (the
    machine-config-operator's drop-in). The mirror is not marked insecure anywhere."""
    dead = f"127.0.0.1:{free_port()}"
    ref = pushed.base_b.reference(dead)
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    authority = Authority("nodeagent-test mirror client CA")
    client_ca, cert, key = tmp_path / "client-ca.pem", tmp_path / "client.cert", tmp_path / "key"
    client_ca.write_bytes(authority.cert_pem)
    authority.client("mirror-reader").write_pair(cert, key)
    with Registry(
        tmp_path / "mirror",
        htpasswd_users={USER: PASSWORD},
        tls=True,
        client_ca=client_ca,
        client_pair=(cert, key),
        storage_root=registry.root,
    ) as mirror:
        crio = Crio(tmp_path / "crio", insecure_registries=[dead])
        crio.write_files()
        crio_auth = tmp_path / "kubelet-config.json"
        crio_auth.write_text(json.dumps({"auths": {mirror.host: {"auth": token}}}))
        (crio.dropin_dir / "00-default").write_text(
            f'[crio.image]\nglobal_auth_file = "{crio_auth}"\n'
        )
        (crio.registries_dir / "99-idms.conf").write_text(
            f'[[registry]]\nprefix = ""\nlocation = "{dead}"\nmirror-by-digest-only = true\n'
            f'[[registry.mirror]]\nlocation = "{mirror.host}"\n'
        )
        host_certs = crio.certs_d_dir / mirror.host
        host_certs.mkdir(parents=True)
        shutil.copy(mirror.ca_file, host_certs / "ca.crt")
        shutil.copy(cert, host_certs / "client.cert")
        shutil.copy(key, host_certs / "client.key")
        with crio:
            agent = pinned_with_no_credentials_of_its_own(tmp_path, crio, "mirrored-tls", ref)
        lines = mirror.log_path.read_text().splitlines()
    served = [line for line in lines if "/manifests/" in line and 'HTTP/1.1" 200 ' in line]
    assert len(served) >= 2  # nodeagent's sizing and CRI-O's pull, both through the mirror
    assert any("/blobs/" in line and 'HTTP/1.1" 200 ' in line for line in lines)  # CRI-O's
    log = agent.log_text()
    assert PASSWORD not in log and token not in log
    assert "SizeUnknown" not in log  # sized through the mirror, not held
