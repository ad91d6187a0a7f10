"""A follower with an empty store and nothing to fetch loads neither aiohttp nor the store's
fetch code, and cluster mode reads the kubelet's certificate without cryptography
(``daemon.fetch_ports``, ``strict.x509_names``; decision 0069: 66.2 → 50.8 MiB idle in
cluster mode). A fresh interpreter builds the fetcher's ports as ``follow_peers`` does,
asks an empty store what the fetcher's first look asks, names the node from a kubelet
certificate, then lists ``sys.modules``; then a store holding a rollback mark makes the
same questions load the store's code and answer from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.testenv.pki import Authority

PROBE = """
import json, sys
from pathlib import Path
from nodeagent.config import load_config
from nodeagent.adapters.kubelet_identity import with_node_name
from nodeagent.daemon.fetch_ports import LazyFetchStore, LazyPeerClient

root = Path(sys.argv[1])
config = with_node_name(load_config(Path("/config.toml"), root=root))
assert config.cluster.enabled and config.store_dir == root / "store", config
store = LazyFetchStore(config)
client = LazyPeerClient(config, tls=None)
answers = [store.held(), store.unfinished(), list(store.accepted()), store.stored_signed("b1")]
print(json.dumps({"node": config.cluster.node_name, "answers": answers,
                  "modules": sorted(sys.modules)}))
"""

HEAVY = ("aiohttp", "cryptography", "nodeagent.adapters.store.fetched",
         "nodeagent.adapters.http.client", "nodeagent.bundles.manifest")  # fmt: skip


def probe(root: Path) -> dict[str, object]:
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(root)],
        capture_output=True, text=True, check=False, cwd=repo,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def make_root(tmp_path: Path) -> Path:
    """A host root under ``tmp_path`` (the configuration's paths are read beneath it)."""
    cert = tmp_path / "var/lib/kubelet/pki/kubelet-client-current.pem"
    cert.parent.mkdir(parents=True)
    Authority("kubelet-signer").client("worker-7.example.com").write_pair(cert, cert)
    (tmp_path / "store").mkdir()
    (tmp_path / "config.toml").write_text('[cluster]\nenabled = true\n\n[store]\npath = "/store"\n')
    return tmp_path


def test_an_empty_store_and_no_request_load_neither_aiohttp_nor_the_fetch_code(
    tmp_path: Path,
) -> None:
    result = probe(make_root(tmp_path))
    assert result["node"] == "worker-7.example.com"  # read from the certificate
    assert result["answers"] == [{}, [], [], None]
    loaded = set(result["modules"])  # type: ignore[call-overload]
    assert "nodeagent.daemon.fetch_ports" in loaded and "ssl" in loaded
    assert not {m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY}, loaded & set(HEAVY)


def test_a_store_with_a_mark_is_read_by_the_store_code(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    (root / "store" / "rollback-marks.json").write_text("{}")  # damaged: the code says so
    result = probe(root)
    assert "nodeagent.adapters.store.fetched" in result["modules"]  # type: ignore[operator]
