"""The node mirror over a real store, pulled from by the real CRI-O, skopeo and podman.

The images' registries do not exist (``registry.example:5000``, ``catalog.example:5000``):
every pull that succeeds came from the node mirror. The last test pulls with the mirror
killed, from a source registry that is up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.adapters.bundles.mirror import MirrorDropin
from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.http.admission import Caps
from nodeagent.adapters.http.node_mirror import MAX_HELD, NodeMirror
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.bundles.mirror import mirror_repositories
from nodeagent.config.mirror import NODE_MIRROR_DROPIN_NAME
from nodeagent.errors import NodeAgentError
from nodeagent.references import parse_pinned_image_ref
from tests.conftest import Pushed
from tests.testenv.crio import Crio
from tests.testenv.node_mirror import HeldStore, held_store, node_mirror
from tests.testenv.registry import Registry
from tests.testenv.signed_bundles import Keys, image, signed_bundle, with_sigstore
from tests.testenv.sigstore import SigningKey

PULL_TIMEOUT_S = 120.0


@pytest.fixture
def held(tmp_path: Path) -> HeldStore:
    return held_store(tmp_path)


@pytest.fixture
async def mirror(held: HeldStore) -> AsyncIterator[NodeMirror]:
    async with node_mirror(held) as server:
        yield server


@pytest.fixture
def request_cleanup() -> Iterator[Callable[[Path], None]]:
    made: list[Path] = []
    yield made.append
    for path in made:
        subprocess.run(["umount", "-R", str(path)], capture_output=True, check=False)
        shutil.rmtree(path, ignore_errors=True)


def host_of(mirror: NodeMirror) -> str:
    return f"127.0.0.1:{mirror.port}"


async def point_crio_at(crio: Crio, refs: tuple[str, ...], mirror_host: str) -> None:
    """The drop-in the registries.conf helper renders (its renderer is the import-time
    mirror's: each repository mirrored at ``mirror_host/<repo>``, digest-only)."""
    dropin = MirrorDropin(crio.registries_dir / NODE_MIRROR_DROPIN_NAME)
    assert dropin.write(mirror_repositories(parse_pinned_image_ref(r) for r in refs), mirror_host)
    await asyncio.to_thread(crio.reload)


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def path_of(ref: str, mirror: NodeMirror) -> str:
    """``ref`` as asked of the mirror directly: ``127.0.0.1:<port>/<repo>@<digest>``."""
    parsed = parse_pinned_image_ref(ref)
    return f"{host_of(mirror)}/{parsed.repository}@{parsed.digest}"


async def test_a_stored_unpinned_image_pulls_through_crio(
    fresh_crio: Crio, held: HeldStore, mirror: NodeMirror
) -> None:
    await point_crio_at(fresh_crio, held.bundle_refs, host_of(mirror))
    async with CriClient(fresh_crio.endpoint) as cri:
        for ref in held.bundle_refs:
            await cri.pull_image(ref, timeout_s=PULL_TIMEOUT_S)
            status = await cri.image_status(ref)
            assert status is not None and ref in status.repo_digests
    await mirror.settled()
    counters = mirror.counters
    assert counters.served.blobs_served >= 4 and counters.missing == 0 and counters.denied == 0


async def test_a_registry_set_image_pulls_through_crio_with_the_credential(
    tmp_path: Path, registry: Registry, held: HeldStore, mirror: NodeMirror
) -> None:
    held.write_auth(host_of(mirror))
    settings = f'global_auth_file = "{held.auth_file}"'
    with Crio(tmp_path / "crio", image_settings=settings) as crio:
        await point_crio_at(crio, held.set_refs, host_of(mirror))
        async with CriClient(crio.endpoint) as cri:
            (ref,) = held.set_refs
            await cri.pull_image(ref, timeout_s=PULL_TIMEOUT_S)
            assert await cri.image_status(ref) is not None
    assert mirror.counters.denied == 0


async def test_without_the_credential_crio_gets_no_registry_set_image(
    fresh_crio: Crio, held: HeldStore, mirror: NodeMirror
) -> None:
    await point_crio_at(fresh_crio, held.set_refs, host_of(mirror))
    async with CriClient(fresh_crio.endpoint) as cri:
        with pytest.raises(NodeAgentError):
            await cri.pull_image(held.set_refs[0], timeout_s=PULL_TIMEOUT_S)
    assert mirror.counters.denied >= 1


async def test_skopeo_copies_by_digest(tmp_path: Path, held: HeldStore, mirror: NodeMirror) -> None:
    ref = path_of(held.bundle_refs[0], mirror)
    target = tmp_path / "copied"
    result = await asyncio.to_thread(
        run, "skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}", f"oci:{target}"
    )
    assert result.returncode == 0, result.stderr
    index = json.loads((target / "index.json").read_text())
    assert index["manifests"][0]["digest"] == ref.partition("@")[2]


async def test_podman_pulls_by_digest(
    tmp_path: Path, held: HeldStore, mirror: NodeMirror, request_cleanup: Callable[[Path], None]
) -> None:
    """Debian's podman, with a storage of its own (its runroot must be under 50 characters:
    a short directory of its own under /tmp, removed after)."""
    ref = path_of(held.bundle_refs[1], mirror)
    runroot = Path(tempfile.mkdtemp(prefix="nm-podman-"))
    request_cleanup(runroot)
    storage = ["--root", str(tmp_path / "podman"), "--runroot", str(runroot)]
    result = await asyncio.to_thread(
        run, "podman", *storage, "--storage-driver", "vfs", "pull", "--tls-verify=false", ref
    )
    assert result.returncode == 0, result.stderr
    listed = await asyncio.to_thread(
        run,
        "podman",
        *storage,
        "--storage-driver",
        "vfs",
        "images",
        "--digests",
        "--format",
        "{{.Digest}}",
    )
    assert ref.partition("@")[2] in listed.stdout


async def test_skopeo_with_the_credential_copies_a_registry_set_image(
    tmp_path: Path, held: HeldStore, mirror: NodeMirror
) -> None:
    held.write_auth(host_of(mirror))
    ref = path_of(held.set_refs[0], mirror)
    base = ["skopeo", "copy", "--src-tls-verify=false"]
    anonymous = await asyncio.to_thread(run, *base, f"docker://{ref}", f"oci:{tmp_path / 'a'}")
    assert anonymous.returncode != 0
    with_auth = await asyncio.to_thread(
        run,
        *base,
        "--src-authfile",
        str(held.auth_file),
        f"docker://{ref}",
        f"oci:{tmp_path / 'b'}",
    )
    assert with_auth.returncode == 0, with_auth.stderr


async def test_the_mirror_killed_pulls_go_to_the_source(
    fresh_crio: Crio, pushed: Pushed, held: HeldStore
) -> None:
    """A source registry that is up, mirrored by a node mirror that was stopped."""
    ref = pushed.ref(pushed.base_b)
    server = node_mirror(held)
    async with server:
        host = host_of(server)
    await point_crio_at(fresh_crio, (ref,), host)
    async with CriClient(fresh_crio.endpoint) as cri:
        await cri.pull_image(ref, timeout_s=PULL_TIMEOUT_S)
        assert await cri.image_status(ref) is not None


async def test_a_signature_tag_the_signed_manifest_lists_is_served(tmp_path: Path) -> None:
    """Only the tags a verified signed bundle manifest lists (``imageSignatures``), each with
    exactly its listed manifest; skopeo reads it by that tag."""
    keys = Keys.make(tmp_path / "keys")
    app = image("example/app", [(1 << 18, 7)], tmp_path / "layers")
    plain = signed_bundle(tmp_path / "stick", keys, [app], bundle_id="signed-1", set_name="s")
    signed = with_sigstore(plain, keys, SigningKey())
    store = tmp_path / "store"
    copy_bundle(store, signed.root, signed.manifest, keys.trusted_dir)
    (entry,) = signed.manifest.image_signatures
    server = NodeMirror(
        store,
        host="127.0.0.1",
        port=0,
        verifiers_file=None,
        caps=Caps(16, 16),
        request_timeout_s=20.0,
    )
    async with server:
        target = tmp_path / "signature"
        ref = f"docker://127.0.0.1:{server.port}/example/app:{entry.tag}"
        result = await asyncio.to_thread(
            run, "skopeo", "copy", "--src-tls-verify=false", ref, f"oci:{target}"
        )
        assert result.returncode == 0, result.stderr
        index = json.loads((target / "index.json").read_text())
        assert index["manifests"][0]["digest"] == entry.manifest_digest
        unsigned = f"docker://127.0.0.1:{server.port}/example/app:sha256-{'0' * 64}.sig"
        result = await asyncio.to_thread(
            run, "skopeo", "inspect", "--raw", "--tls-verify=false", unsigned
        )
        assert result.returncode != 0


async def test_held_misses_are_bounded_and_answered_404_at_their_deadline(
    tmp_path: Path,
) -> None:
    """``[mirror] miss_wait_s`` (decision 0061): a manifest the store lacks is held while the
    daemon's fetcher looks, but at most ``MAX_HELD`` at once, so a local flood of random
    digests gets the rest answered 404 at once and holds nothing more; each held one is
    answered 404 at its deadline."""
    store = tmp_path / "store"
    store.mkdir()
    server = NodeMirror(
        store, host="127.0.0.1", port=0, verifiers_file=None, caps=Caps(256, 256),
        request_timeout_s=20.0, miss_wait_s=2.0,
    )  # fmt: skip

    def ask() -> tuple[int, float]:
        digest = "sha256:" + os.urandom(32).hex()
        started = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=15)
        try:
            conn.request("GET", f"/v2/site/none/manifests/{digest}")
            return conn.getresponse().status, time.monotonic() - started
        finally:
            conn.close()

    count = MAX_HELD + 8
    loop = asyncio.get_running_loop()
    async with server:
        with concurrent.futures.ThreadPoolExecutor(count) as threads:  # all at once
            answers = await asyncio.gather(
                *(loop.run_in_executor(threads, ask) for _ in range(count))
            )
    assert {status for status, _ in answers} == {404}
    at_once = [seconds for _, seconds in answers if seconds < 1.0]
    held = [seconds for _, seconds in answers if seconds >= 1.9]
    assert len(at_once) >= 8 and len(held) <= MAX_HELD, answers
    assert held, "nothing was held: miss_wait_s had no effect"
