"""Peers behind the node mirror (issue 25, item 4; decision 0061; docs/mirror.md).

A node with an empty store, in the site network (network namespaces on a bridge, real
daemons and unprivileged peer processes, ``site_net``, ``site_node``), pulls an image with
``skopeo copy`` through its own node mirror on its loopback (``127.0.0.1:22626`` in its
namespace), the registry nowhere. The node mirror never talks to a peer itself: the first
pull finds nothing; the mirror holds it (``[mirror] miss_wait_s``) and reports the miss to
the daemon, which wakes the site fetcher; the fetcher copies the bundle from the peers over
mutual TLS, each blob verified against the signed manifest before it is stored; the held
pull is then served from the store, every byte checked again as it is sent: the first pull
succeeds. Once fetched, the node's
registries.conf drop-in names the repository, and a pull by the image's own name (its
registry resolves nowhere), reading that drop-in as CRI-O does, goes to the node mirror.

A scripted peer with a valid certificate of the site (``tests/testenv/lying_peer.py``,
``bad-blob``) offers the same bundle, idle so it is preferred, and sends every blob with
one byte changed: the fetcher drops it (``StoreSourceMismatch``) and takes the blobs from
the honest node; the pull succeeds with exactly the signed bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.config import NODE_MIRROR_DROPIN_NAME
from tests.integration.testenv.site_helpers import started_network
from tests.testenv.lying_peer import ScriptedPeer
from tests.testenv.signed_bundles import HOST, Keys, Signed, image, signed_bundle
from tests.testenv.site_net import SiteHost
from tests.testenv.site_node import SITE_PORT, SiteNode
from tests.testenv.site_pki import issue_node_cert, make_ca, write_ca, write_pem_bundle
from tests.testenv.waiting import log_tail, wait_for

KIB = 1 << 10
MIRROR = "127.0.0.1:22626"
"""The node mirror's default address (``[mirror] listen``), on each namespace's loopback."""


@contextlib.contextmanager
def closing_all(*items: SiteNode | ScriptedPeer) -> Iterator[None]:
    try:
        yield
    finally:
        for item in items:
            item.close()


class Puller:
    """``skopeo copy`` from a node's mirror, in the node's namespace, without credentials,
    policy or registries.conf of the host (all in ``workdir``)."""

    def __init__(self, workdir: Path, host: SiteHost) -> None:
        self.workdir, self.host = workdir, host
        workdir.mkdir(parents=True, exist_ok=True)
        self.policy = workdir / "policy.json"
        self.policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        self.registries = workdir / "registries.conf"
        self.registries.write_text("")
        self.attempts: list[str] = []

    def command(self, reference: str, target: Path, registries: Path | None) -> list[str]:
        tls = [] if registries is not None else ["--src-tls-verify=false"]
        return [
            *self.host.exec_prefix, "skopeo", "--policy", str(self.policy),
            "--registries-conf", str(registries or self.registries),
            "copy", "--retry-times", "0", *tls, "--src-no-creds",
            f"docker://{reference}", f"oci:{target}",
        ]  # fmt: skip

    def pull(self, reference: str, target: Path, *, registries: Path | None = None) -> bool:
        """One ``skopeo copy docker://<reference> oci:<target>``; whether it succeeded. With
        ``registries`` (the node's drop-in): by the image's own name, the mirror's TLS
        setting the drop-in's; without: plain HTTP to the address in ``reference``."""
        done = subprocess.run(
            self.command(reference, target, registries),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        self.attempts.append(done.stderr.strip()[-300:])
        return done.returncode == 0

    def start(self, reference: str, target: Path) -> subprocess.Popen[str]:
        """The same pull, left running (the caller waits for it)."""
        return subprocess.Popen(
            self.command(reference, target, None),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def oci_blobs(target: Path) -> dict[str, bytes]:
    blobs = target / "blobs" / "sha256"
    return {f"sha256:{p.name}": p.read_bytes() for p in blobs.iterdir()}


@pytest.mark.timeout(240)
def test_an_empty_node_pulls_through_its_mirror_from_a_peer_and_a_liar_is_dropped(
    tmp_path: Path,
) -> None:
    keys = Keys.make(tmp_path / "keys")
    public_key = (keys.trusted_dir / "factory.pub").read_text()
    ca = make_ca("site CA")
    ca_file = write_ca(tmp_path / "ca.crt", ca)
    built = image("site/mirrored", [(256 * KIB, 1), (256 * KIB, 2), (256 * KIB, 3)], tmp_path)
    bundle: Signed = signed_bundle(
        tmp_path / "bundle", keys, [built], bundle_id="mirrored", set_name="mirrored"
    )
    reference = f"{MIRROR}/{built.repository}@{built.digest}"
    own_name = f"{HOST}/{built.repository}@{built.digest}"  # a host that resolves nowhere
    with started_network(3) as net:
        source_host, empty_host, liar_host = net.hosts
        armed = tmp_path / "armed"  # the liar offers the bundle once the source holds it
        pem = write_pem_bundle(
            tmp_path / "liar.pem", issue_node_cert(ca, "liar", [liar_host.address])
        )
        liar = ScriptedPeer(
            tmp_path / "liar", [bundle.root], pem, ca_file, addr=liar_host.address,
            port=SITE_PORT, mode="bad-blob", prefix=liar_host.exec_prefix, armed_by=armed,
        )  # fmt: skip
        source = SiteNode(
            tmp_path / "source", source_host, name="source", ca=ca, trusted_keys=[public_key]
        )
        empty = SiteNode(
            tmp_path / "empty", empty_host, name="empty", ca=ca, trusted_keys=[public_key],
            peers=[liar.address, source.address], serve_mirror=True,
        )  # fmt: skip
        puller = Puller(tmp_path / "pull", empty_host)
        with closing_all(liar, source, empty):
            source.start()
            empty.start()
            empty.wait_log("node_mirror_started")
            empty.wait_log("peer_reports_listening")  # the peer unit starts After= the daemon
            # nobody holds it yet: the mirror holds the pull ([mirror] miss_wait_s), the miss
            # reaches the daemon, whose fetcher looks at the peers
            target = tmp_path / "pulled"
            first = puller.start(reference, target)
            empty.wait_status(
                lambda s: built.digest in (s.get("nodeMirror") or {}).get("recentMissing", []),
                what="the miss reported to the daemon",
                timeout_s=30,
            )
            # the source gets the bundle (a stick's import, store-only); the liar arms; the
            # fetch brings it while the first pull waits, which then succeeds
            copy_bundle(source.state_dir / "store", bundle.root, bundle.manifest, keys.trusted_dir)
            armed.touch()
            output, _ = first.communicate(timeout=120)
            assert first.returncode == 0, f"{output[-600:]}\n{log_tail(empty.log_path)}"
            # by the image's own name (its registry resolves nowhere), as CRI-O pulls it:
            # the drop-in the fetch brought sends it to the node mirror
            dropin = empty.path(f"/etc/containers/registries.conf.d/{NODE_MIRROR_DROPIN_NAME}")
            wait_for(
                lambda: dropin.is_file() and built.repository in dropin.read_text(),
                timeout_s=30, what="the drop-in naming the fetched repository",
            )  # fmt: skip
            by_name = tmp_path / "by-name"
            assert puller.pull(own_name, by_name, registries=dropin), puller.attempts[-1]
            log = empty.current_run_log()
    pulled = oci_blobs(target)
    for digest in [*bundle.manifest.blobs]:
        if digest in pulled:
            assert f"sha256:{hashlib.sha256(pulled[digest]).hexdigest()}" == digest
    assert {layer.digest for layer in built.layers} <= set(pulled)
    assert oci_blobs(by_name) == pulled
    assert built.digest in pulled  # the image's manifest, by the digest pulled
    assert liar.requests("/blobs/"), "the liar was never asked for a blob: no attack happened"
    dropped = (
        rf"bundle_fetch_peer_dropped: .*peer={re.escape(liar.address)} reason=StoreSourceMismatch"
    )
    assert re.search(dropped, log), log
    assert "bundle_fetched: bundle=mirrored" in log
    assert f"node_mirror_miss_served: digest={built.digest}" in log  # held, not refused
