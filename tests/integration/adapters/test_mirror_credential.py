"""``publish_mirror_credential`` on real files: the entry it adds, what it keeps, what the
peer process is given (verifiers only), and the files it never writes."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

from nodeagent.adapters.mirror_credential import (
    publish_mirror_credential,
    withdraw_mirror_credential,
)
from nodeagent.mirror.credentials import VERIFIER_NAME, is_allowed, parse_verifiers

HOST = "127.0.0.1:22626"


def basic_of(auth_file: Path) -> str:
    token: str = json.loads(auth_file.read_text())["auths"][HOST]["auth"]
    return f"Basic {token}"


def test_an_entry_is_added_once_others_kept_and_only_verifiers_given(tmp_path: Path) -> None:
    root_auth = tmp_path / "run" / "containers" / "0" / "auth.json"
    root_auth.parent.mkdir(parents=True)
    root_auth.write_text(json.dumps({"auths": {"quay.io": {"auth": "eDp5"}}}))
    peer_dir = tmp_path / "peer"
    peer_dir.mkdir()
    first = publish_mirror_credential(HOST, peer_dir, [], root_auth_file=root_auth)
    assert first.created and first.verifiers == 1
    doc = json.loads(root_auth.read_text())
    assert doc["auths"]["quay.io"] == {"auth": "eDp5"}
    assert stat.S_IMODE(root_auth.stat().st_mode) == 0o600
    verifiers_file = peer_dir / VERIFIER_NAME
    password = base64.b64decode(doc["auths"][HOST]["auth"]).decode().partition(":")[2]
    assert password.encode() not in verifiers_file.read_bytes()
    assert stat.S_IMODE(verifiers_file.stat().st_mode) == 0o640
    assert is_allowed(basic_of(root_auth), parse_verifiers(verifiers_file.read_bytes()))
    again = publish_mirror_credential(HOST, peer_dir, [], root_auth_file=root_auth)
    assert not again.created and json.loads(root_auth.read_text()) == doc
    withdraw_mirror_credential(peer_dir)
    assert not verifiers_file.exists()


def test_an_entry_in_crio_s_file_is_accepted_never_written(tmp_path: Path) -> None:
    kubelet = tmp_path / "config.json"
    token = base64.b64encode(b"cluster:from-the-pull-secret").decode()
    kubelet.write_text(json.dumps({"auths": {HOST: {"auth": token}}}))
    before = kubelet.read_bytes()
    root_auth = tmp_path / "auth.json"
    published = publish_mirror_credential(HOST, tmp_path, [kubelet], root_auth_file=root_auth)
    assert published.verifiers == 2 and kubelet.read_bytes() == before
    verifiers = parse_verifiers((tmp_path / VERIFIER_NAME).read_bytes())
    assert is_allowed(f"Basic {token}", verifiers)
    assert is_allowed(basic_of(root_auth), verifiers)


def test_a_file_that_is_not_json_is_left_untouched(tmp_path: Path) -> None:
    root_auth = tmp_path / "auth.json"
    root_auth.write_text("{not json")
    published = publish_mirror_credential(HOST, tmp_path, [], root_auth_file=root_auth)
    assert published.verifiers == 0 and not published.created
    assert root_auth.read_text() == "{not json"
    assert parse_verifiers((tmp_path / VERIFIER_NAME).read_bytes()) == frozenset()
