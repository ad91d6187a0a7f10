"""The malicious-bundle corpus (tests/testenv/bundle_flaws.py) against the import and `verify`.

In process, on files in tmp_path. Real parts: every bundle adapter (tree and intake checks,
the loopback server, the mirror drop-in, the spec directories, the state store) and the
importer. The runtime is tests/fakes' CRI-O, which records pulls: no case may reach one.
Cases the import finds only while the runtime pulls (``stage="serve"``) are imported
against a real CRI-O in test_corpus_runtime.py; here `bundle verify` finds them.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import io
import os
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.bundles.intake import SpecDirs, check_for_import
from nodeagent.adapters.bundles.mirror import MirrorDropin
from nodeagent.adapters.bundles.session_server import ChildLauncher, SessionServer
from nodeagent.adapters.bundles.tree import verify_bundle
from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.host import StatvfsSpace
from nodeagent.bundles.content import check_architecture, check_content
from nodeagent.bundles.import_ports import ImporterPorts
from nodeagent.bundles.importer import Importer
from nodeagent.bundles.manifest import (
    BundleIncomplete,
    BundleSizeMismatch,
    ExpectedFile,
    parse_manifest,
)
from nodeagent.bundles.tree_rules import check_digest
from nodeagent.cli import main as cli
from nodeagent.daemon.bundles import session_command
from nodeagent.disk import DiskPolicy
from nodeagent.errors import NodeAgentError
from nodeagent.ports import FilesystemSpace
from nodeagent.prepull import PrePuller, PullPolicy
from nodeagent.registries import node_platform
from nodeagent.status import BundleReport
from tests.fakes.crio import FakeCrio, MemoryDropins
from tests.fakes.reloader import RecordingReloader
from tests.testenv.bundle_corpus import CorpusKeys, Draft, good_draft, make_keys
from tests.testenv.bundle_flaws import CASES
from tests.testenv.images import canonical_json

PLATFORM = node_platform(os.uname().machine)
MESSAGE_CHARS = 1500
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


@pytest.fixture(scope="module")
def keys() -> CorpusKeys:
    return make_keys()


@pytest.fixture(scope="module")
def good() -> Draft:
    return good_draft(PLATFORM)


class RootSpace:
    """``SpaceProbe``: the fake runtime's image filesystem is this machine's root."""

    def space(self, mountpoint: str) -> FilesystemSpace:
        return StatvfsSpace().space("/")


@dataclass
class Node:
    """The node's side of an import in process: where anything imported would show."""

    base: Path
    runtime: FakeCrio
    importer: Importer
    reports: list[BundleReport]

    @property
    def mirror(self) -> Path:
        return self.base / "registries.conf.d" / "99-nodeagent-bundle-mirror.conf"

    def spec_files(self) -> list[Path]:
        return sorted((self.base / "specs").rglob("*"))

    def imported(self) -> dict[str, object]:
        doc = JsonStateStore(self.base / "state").load("bundles") or {}
        return dict(doc.get("imported", {}))

    def assert_nothing_imported(self) -> None:
        assert self.runtime.pull_calls == []
        assert self.spec_files() == [self.base / "specs" / "etc", self.base / "specs" / "run"]
        assert not self.mirror.exists()
        assert self.imported() == {}
        assert [r.state for r in self.reports] in (
            ["detected", "rejected"],
            ["detected", "verified", "admitted", "importing", "rejected"],
        )


def make_node(base: Path, trusted_keys: Path) -> Node:
    runtime = FakeCrio()
    reports: list[BundleReport] = []
    for directory in ("specs/etc", "specs/run", "registries.conf.d", "state"):
        (base / directory).mkdir(parents=True)
    ports = ImporterPorts(
        verify=lambda root: check_for_import(root, trusted_keys, PLATFORM),
        runtime=runtime,
        make_server=functools.partial(
            SessionServer, ChildLauncher(session_command(base / "no-config.toml"))
        ),
        mirror=MirrorDropin(base / "registries.conf.d" / "99-nodeagent-bundle-mirror.conf"),
        reloader=RecordingReloader(MemoryDropins(), runtime),
        make_puller=lambda: PrePuller(runtime, lambda _ref: None, PullPolicy(attempts=1)),
        space=RootSpace(),
        specs=SpecDirs(base / "specs" / "etc", base / "specs" / "run"),
        store=JsonStateStore(base / "state"),
        on_report=reports.append,
    )
    return Node(base, runtime, Importer(ports, DiskPolicy(reserve_bytes=0)), reports)


def assert_safe_message(message: str) -> None:
    assert len(message) <= MESSAGE_CHARS, len(message)
    assert _UNSAFE.search(message) is None, message[:200]


# ---------------------------------------------------------------- the good bundle
async def test_the_good_bundle_verifies_and_imports(
    good: Draft, keys: CorpusKeys, tmp_path: Path
) -> None:
    root = good.write(tmp_path / "bundle", keys)
    trusted = keys.install(tmp_path / "trusted")
    report = verify_bundle(root, trusted, platform=PLATFORM)
    assert report.error is None
    assert report.hashed_bytes == report.manifest.total_size_bytes if report.manifest else False
    node = make_node(tmp_path / "node", trusted)
    result = await node.importer.import_bundle(root, source="corpus")
    assert (result.state, result.reason) == ("imported", None)
    assert sorted(node.runtime.pull_calls) == sorted(str(i["name"]) for i in good.doc["images"])
    written = node.base / "specs" / "etc" / "bundle-corpus-good-corpus-apps.yaml"
    assert written in node.spec_files()
    assert not node.mirror.exists()
    assert list(node.imported()) == ["corpus-good"]


def tree_fingerprint(root: Path) -> tuple[tuple[str, str], ...]:
    """Every entry under ``root``: its path and what it is (content digest, link target...)."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            what = f"link {path.readlink()}"
        elif path.is_file():
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            what = "dir" if path.is_dir() else "special"
        found.append((path.relative_to(root).as_posix(), what))
    return tuple(found)


def test_the_corpus_is_large_and_each_flaw_distinct(
    good: Draft, keys: CorpusKeys, tmp_path: Path
) -> None:
    """At least 40 flaws, and no two of them make the same bundle."""
    assert len(CASES) >= 40
    seen: dict[tuple[tuple[str, str], ...], str] = {}
    for number, (name, case) in enumerate(CASES.items()):
        draft = good.copy()
        case.flaw(draft)
        fingerprint = tree_fingerprint(draft.write(tmp_path / str(number), keys))
        assert fingerprint not in seen, (name, seen.get(fingerprint))
        seen[fingerprint] = name


# ---------------------------------------------------------------- every flaw
@pytest.mark.parametrize("name", list(CASES))
async def test_flawed_bundle_is_refused_with_its_reason_and_nothing_imported(
    name: str, good: Draft, keys: CorpusKeys, tmp_path: Path
) -> None:
    case = CASES[name]
    draft = good.copy()
    case.flaw(draft)
    root = draft.write(tmp_path / "bundle", keys)
    trusted = keys.install(tmp_path / "trusted")

    report = verify_bundle(root, trusted, platform=PLATFORM)
    assert report.error is not None, f"{name}: bundle verify accepted it"
    assert report.error.reason == case.reason, report.error
    assert_safe_message(report.error.message)

    if case.stage == "check":
        node = make_node(tmp_path / "node", trusted)
        result = await node.importer.import_bundle(root, source="corpus")
        assert (result.state, result.reason) == ("rejected", case.reason), result.message
        assert_safe_message(result.message or "")
        node.assert_nothing_imported()


@pytest.mark.parametrize(
    "name",
    [
        "created holding terminal escape sequences",
        "10 MB bundleId",
        "file name holding terminal escape sequences",
    ],
)
def test_bundle_verify_prints_no_bundle_text_raw(
    name: str, good: Draft, keys: CorpusKeys, tmp_path: Path
) -> None:
    draft = good.copy()
    CASES[name].flaw(draft)
    root = draft.write(tmp_path / "bundle", keys)
    trusted = keys.install(tmp_path / "trusted")
    for extra in ([], ["--json"]):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = cli.main(["--config", "/nonexistent.toml", "bundle", "verify", str(root),
                             "--trusted-keys", str(trusted), *extra])  # fmt: skip
        assert code == 65
        text = out.getvalue() + err.getvalue()
        assert "\x1b" not in text and "\x07" not in text
        assert len(text) < 5000


def test_bundle_verify_clips_the_trusted_comment_of_a_good_bundle(
    good: Draft, keys: CorpusKeys, tmp_path: Path
) -> None:
    """A trusted key may sign a trusted comment with escape sequences: never shown raw."""
    from nodeagent.bundles import minisign

    draft = good.copy()
    comment = "\x1b]0;owned\x07\x1b[2J" + "x" * 5000
    draft.signature = minisign.sign(
        draft.bundle_json(), keys.trusted, trusted_comment=comment
    ).encode()
    root = draft.write(tmp_path / "bundle", keys)
    trusted = keys.install(tmp_path / "trusted")
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        code = cli.main(["--config", "/nonexistent.toml", "bundle", "verify", str(root),
                         "--trusted-keys", str(trusted)])  # fmt: skip
    assert code == 0
    assert "\x1b" not in out.getvalue()
    assert "\\x1b]0;owned\\x07" in out.getvalue()
    assert len(out.getvalue()) < 2000


def test_docs_security_lists_every_case_with_its_reason() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "security.md").read_text()
    assert f"**{len(CASES)} malicious bundles**" in text
    rows = set(re.findall(r"^\| (.+?) \| `(\w+)`", text, re.MULTILINE))
    listed = {(case.name.replace("|", "\\|"), case.reason) for case in CASES.values()}
    assert listed - rows == set()


# ---------------------------------------------------------------- random mutations
MUTATIONS = int(os.environ.get("NODEAGENT_BUNDLE_MUTATIONS", "1500"))
"""``make test`` runs 1,500 (under a second); set the variable for more (20,000: 8 s)."""
POOL: list[Any] = [
    None, True, False, 0, -1, 1 << 63, 1.5, "", "x" * 300, "\x1b[2J", "../..", "a/b",
    "sha256:" + "0" * 64, [], {}, [[[]]], {"a": {"b": []}}, [{"digest": 1}],
    f"quay.io/a/b@sha256:{'1' * 64}", "2026-11-22T09:30:00Z", {"os": 1},
]  # fmt: skip


def paths_of(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, (dict, list)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            yield from paths_of(item, (*path, key))


def mutated(doc: Any, rng: random.Random) -> Any:
    """``doc`` with one value replaced, or one key or item removed."""
    doc = copy.deepcopy(doc)
    path = rng.choice(list(paths_of(doc))[1:])
    parent = functools.reduce(lambda value, key: value[key], path[:-1], doc)
    if rng.random() < 0.2:
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(POOL)
    return doc


def memory_reader(draft: Draft) -> Callable[[ExpectedFile], bytes]:
    """``content.ReadFile`` over the draft's files, with the adapter's checks."""

    def read(file: ExpectedFile) -> bytes:
        data = draft.files.get(file.path)
        if data is None:
            raise BundleIncomplete(f"{file.path} is missing")
        if len(data) != file.size_bytes:
            raise BundleSizeMismatch(f"{file.path} size")
        check_digest(file, hashlib.sha256(data).hexdigest())
        return data

    return read


def judge(draft: Draft) -> str:
    """What the import's pure checks say of ``draft``: a reason code, or accepted."""
    try:
        manifest = parse_manifest(draft.bundle_json())
        check_architecture(manifest, PLATFORM)
        check_content(manifest, PLATFORM, memory_reader(draft))
    except NodeAgentError as error:
        assert_safe_message(error.message)
        return error.reason
    return "accepted"


def test_random_mutations_of_bundle_json_and_its_manifests_never_crash(good: Draft) -> None:
    """Any value of bundle.json or of a manifest, config or index.json replaced or removed:
    a reason code or acceptance, never another exception (seeded: reproducible)."""
    rng = random.Random(1313)  # noqa: S311  (reproducible test input, not a secret)
    outcomes: Counter[str] = Counter()
    roles = ["app_manifest", "app_config", "multi_index", "multi_child", "multi_config"]
    for number in range(MUTATIONS):
        draft = good.copy()
        if number % 3:
            draft.doc = mutated(draft.doc, rng)
        else:
            role = roles[number % len(roles)]
            draft.replace_blob(
                draft.parts[role], canonical_json(mutated(draft.json_of(draft.parts[role]), rng))
            )
        outcomes[judge(draft)] += 1
    assert sum(outcomes.values()) == MUTATIONS
    assert len(outcomes) >= 8, outcomes  # many rules were hit, not one
