"""Store-only site nodes (no CRI-O) fetching from each other: the daemon's fetcher as run.

Four node namespaces on a shaped bridge (16 Mbit/s each way per node, so a 12 MiB bundle
takes seconds, long enough to cut a fetch in the middle), each running ``nodeagent run``
with ``[site] serve = true`` and the others as static ``[site] peers`` (so ``follow =
auto`` is on). Node 0's store holds a signed bundle (copied by the store's copier, as
after a stick). Node 1 fetches it, is killed half way and started again: it resumes from
its partials and signed manifest, and the bytes it fetched in both runs add up to the
bundle once. Node 2's store is capped at 1 MiB: it refuses, with ``StoreFull`` in its
status. Node 3 trusts no key: it never stores a byte of the bundle, and its status says
why. No node imports (there is no runtime), so a fetched bundle ends ``stored``.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.store import layout
from tests.integration.testenv.site_helpers import started_network
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle
from tests.testenv.site_node import SiteNode
from tests.testenv.site_pki import make_ca
from tests.testenv.waiting import log_tail, wait_for

pytestmark = pytest.mark.integration

MIB = 1 << 20
BUNDLE_ID = "site-fetch-1"


def store_of(node: SiteNode) -> Path:
    return node.state_dir / "store"


def bundle_entry(node: SiteNode) -> dict[str, Any] | None:
    for entry in (node.status() or {}).get("bundles", []):
        if entry.get("bundleId") == BUNDLE_ID:
            return dict(entry)
    return None


def held_bytes(store: Path) -> int:
    blobs = BlobStore(store)
    stored = sum(blobs.stored().values())
    return stored + sum(size for size, _ in blobs.partials().values())


def received_bytes(log: str) -> int:
    found = re.findall(r"bundle_fetched: .*received_bytes=(\d+)", log)
    assert len(found) == 1, log
    return int(found[0])


def assert_verified_copy(store: Path, bundle: Signed) -> None:
    blobs = BlobStore(store)
    assert set(blobs.stored()) == set(bundle.manifest.blobs)
    for digest in blobs.stored():
        assert f"sha256:{hashlib.sha256(blobs.path(digest).read_bytes()).hexdigest()}" == digest
    assert (store / layout.bundle_dir(BUNDLE_ID) / layout.RECORD_NAME).is_file()
    assert not blobs.partials()


@pytest.mark.timeout(240)
def test_store_only_nodes_fetch_resume_after_a_kill_and_refuse_with_their_reason(
    tmp_path: Path,
) -> None:
    keys = Keys.make(tmp_path / "keys")
    cache = tmp_path / "layers"
    images = [
        image("site/app", [(4 * MIB, 1), (2 * MIB, 2)], cache),
        image("site/tools", [(4 * MIB, 3), (2 * MIB, 4)], cache),
    ]
    bundle = signed_bundle(tmp_path / "stick", keys, images, bundle_id=BUNDLE_ID, set_name="s")
    total = sum(f.size_bytes for f in bundle.manifest.blobs.values())
    public_key = (keys.trusted_dir / "factory.pub").read_text()
    ca = make_ca("site CA")
    with started_network(4, rate_mbit=16) as net:
        addresses = [f"{h.address}:9447" for h in net.hosts]
        nodes = [
            SiteNode(
                tmp_path / f"node-{h.index}",
                h,
                name=f"node-{h.index}",
                ca=ca,
                peers=[a for a in addresses if a != addresses[h.index]],
                trusted_keys=[] if h.index == 3 else [public_key],
                extra_config='[store]\nmax_bytes = "1MiB"\n' if h.index == 2 else "",
            )
            for h in net.hosts
        ]
        copy_bundle(store_of(nodes[0]), bundle.root, bundle.manifest, keys.trusted_dir)
        try:
            for node in nodes:
                node.start()
            fetcher = nodes[1]
            fetcher.wait_log("bundle_fetch_started", timeout_s=60)
            wait_for(
                lambda: held_bytes(store_of(fetcher)) >= 3 * MIB,
                timeout_s=60,
                interval_s=0.05,
                what="node 1 to hold a part of the bundle",
                detail=lambda: log_tail(fetcher.log_path),
            )
            fetcher.kill()  # a power cut in the middle of the fetch
            kept = held_bytes(store_of(fetcher))
            assert 0 < kept < total
            first_log = fetcher.current_run_log()
            assert "bundle_fetched:" not in first_log
            fetcher.start()
            fetcher.wait_log("bundle_fetched", timeout_s=90)
            second_log = fetcher.current_run_log()
            assert "bundle_fetch_resumed" in second_log
            assert received_bytes(second_log) <= total - kept  # nothing fetched twice
            assert_verified_copy(store_of(fetcher), bundle)
            entry = fetcher.wait_status(
                lambda s: (bundle_entry_of(s) or {}).get("state") in ("stored", "rejected"),
                what="node 1's bundle after the fetch",
            )
            assert bundle_entry_of(entry) is not None

            full = nodes[2].wait_status(
                lambda s: (bundle_entry_of(s) or {}).get("reason") == "StoreFull",
                what="node 2 refusing for lack of store space",
            )
            assert "[store] max_bytes" in bundle_entry_of(full)["message"]  # type: ignore[index]
            assert BlobStore(store_of(nodes[2])).stored() == {}

            untrusted = nodes[3].wait_status(
                lambda s: (bundle_entry_of(s) or {}).get("reason") == "BundleSignedByUnknownKey",
                what="node 3 refusing a bundle signed by a key it does not trust",
            )
            assert bundle_entry_of(untrusted)["state"] == "rejected"  # type: ignore[index]
            assert BlobStore(store_of(nodes[3])).stored() == {}
            assert not (store_of(nodes[3]) / layout.bundle_dir(BUNDLE_ID)).exists()
            assert "bundle_fetch_refused" in nodes[3].current_run_log()
        finally:
            for node in nodes:
                node.close()


def bundle_entry_of(status: dict[str, Any]) -> dict[str, Any] | None:
    for entry in status.get("bundles", []):
        if entry.get("bundleId") == BUNDLE_ID:
            return dict(entry)
    return None
