"""Fuzz: a bundle medium's file tree against its manifest (``bundles.tree_rules.check_tree``).

``check_tree`` compares a walk of the medium with a manifest that parsed, so raw or edited
``bundle.json`` bytes reach it only when they happen to parse (a few in a hundred). Here the
inputs are built in two steps so that nearly every one reaches it: a manifest of valid shape
whose ``files`` list is generated (paths, depths, sizes) and parsed with ``parse_manifest``,
then the tree the medium would show for it (every listed file, ``bundle.json``, its signature
and the parent directories) edited a few times: reordered, an entry dropped, a size changed,
an entry turned into a symbolic link or a special file, hostile entries added (unlisted
files, ``..`` and escape sequences in names, files inside ``lost+found``), harmless ones added
(an empty ``lost+found``, an entry seen twice).

Contract: a refused tree raises a ``NodeAgentError`` with a clipped message; the unedited
tree, and a tree with only harmless edits, is accepted; a tree with a missing, resized,
unlisted or unsafe entry is refused.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.bundles.manifest import MANIFEST_NAME, SIGNATURE_NAME, BundleManifest, parse_manifest
from nodeagent.bundles.tree_rules import METADATA_DIRS, TreeEntry, check_tree
from tests.fuzz import strategies as s
from tests.fuzz.contract import outcome
from tests.fuzz.test_bundles import _BUNDLE

_SAFE = st.text(st.sampled_from("abcxyz019-_.é"), min_size=1, max_size=12).filter(
    lambda part: part not in (".", "..")
)
_PATHS = st.lists(st.one_of(_SAFE, st.just("a" * 255)), min_size=1, max_size=4).map("/".join)
_SIZES = st.one_of(st.integers(0, 4096), st.sampled_from([(1 << 63) - 1, 1 << 40]))
_HEX = st.text(st.sampled_from("0123456789abcdef"), min_size=64, max_size=64)
_LISTED = st.lists(
    st.fixed_dictionaries({"path": _PATHS, "sha256": _HEX, "sizeBytes": _SIZES}),
    max_size=12, unique_by=lambda item: item["path"],
)  # fmt: skip
_HOSTILE = st.one_of(
    st.sampled_from([
        "..", "../outside", "a/../../b", "/etc/passwd", "lost+found/recovered",
        "System Volume Information/IndexerVolumeGuid", "\x1b[2J", "q\ud800", "x" * 5000,
        "bundle.json/x", "blobs", "blobs/sha256/" + "f" * 64, "\u202egpj.exe", "a\0b",
    ]),
    s.text,
).filter(lambda path: path not in (MANIFEST_NAME, SIGNATURE_NAME))  # fmt: skip
_EDITS = st.lists(
    st.one_of(
        st.tuples(st.just("drop"), st.integers(0, 10_000)),
        st.tuples(st.just("resize"), st.integers(0, 10_000), st.integers(-(2**64), 2**64)),
        st.tuples(st.just("unsafe"), st.integers(0, 10_000), st.sampled_from(["symlink", "other"])),
        st.tuples(st.just("add"), _HOSTILE, st.sampled_from(["file", "dir", "symlink", "other"])),
        st.tuples(st.just("again"), st.integers(0, 10_000)),
        st.tuples(st.just("metadata"), st.sampled_from(sorted(METADATA_DIRS))),
        st.tuples(st.just("swap"), st.integers(0, 10_000), st.integers(0, 10_000)),
    ),
    max_size=5,
)  # fmt: skip


def _tree(manifest: BundleManifest) -> list[TreeEntry]:
    """What a walk of a complete, untouched medium for ``manifest`` shows."""
    entries = [TreeEntry(f.path, "file", f.size_bytes) for f in manifest.files]
    entries += [TreeEntry(MANIFEST_NAME, "file", 900), TreeEntry(SIGNATURE_NAME, "file", 300)]
    return [TreeEntry(p, "dir") for p in sorted(_parents(entries))] + entries


def _parents(entries: list[TreeEntry]) -> set[str]:
    return {
        "/".join(e.path.split("/")[:i]) for e in entries for i in range(1, e.path.count("/") + 1)
    }


def _edit(tree: list[TreeEntry], edits: list[tuple[Any, ...]]) -> None:
    """Apply ``edits`` to ``tree`` in place (an index picks an entry modulo the tree's size)."""
    for kind, *args in edits:
        if kind == "add":
            tree.append(TreeEntry(args[0], args[1], 7))
        elif kind == "metadata":
            tree.append(TreeEntry(args[0], "dir"))
        elif tree:
            at = args[0] % len(tree)
            entry = tree[at]
            if kind == "drop":
                del tree[at]
            elif kind == "resize":
                tree[at] = TreeEntry(entry.path, entry.kind, args[1])
            elif kind == "unsafe":
                tree[at] = TreeEntry(entry.path, args[1], entry.size_bytes)
            elif kind == "again":
                tree.append(entry)
            else:  # swap
                other = args[1] % len(tree)
                tree[at], tree[other] = tree[other], entry


def _must_refuse(tree: list[TreeEntry], manifest: BundleManifest) -> bool:
    """docs/bundle-format.md, "The tree", written as a model: every listed file present with
    its size; only regular files and directories; no file the manifest does not list; no
    directory that holds no listed file, but for the empty metadata ones."""
    listed = {f.path: f.size_bytes for f in manifest.files}
    parents = _parents([TreeEntry(p, "file") for p in [*listed, MANIFEST_NAME, SIGNATURE_NAME]])
    files = {e.path for e in tree if e.kind == "file"}
    for entry in tree:
        top = entry.path.split("/", 1)[0]
        if entry.kind in ("symlink", "other") or (
            top in METADATA_DIRS and top != entry.path and top not in parents
        ):
            return True
        if entry.kind == "dir" and entry.path not in parents | METADATA_DIRS:
            return True
        if entry.kind == "file" and entry.path not in {*listed, MANIFEST_NAME, SIGNATURE_NAME}:
            return True
        if entry.kind == "file" and entry.path in listed and entry.size_bytes != listed[entry.path]:
            return True
    return not set(listed) <= files


@given(_LISTED, st.sampled_from(["oci", "registry-v2"]), _EDITS)
@example([{"path": "lost+found", "sha256": "c" * 64, "sizeBytes": 1}], "oci",
         [("add", "lost+found/x", "file")])  # fmt: skip
@example([], "oci", [("add", "\x1b[2J" * 3000, "file")])
@example(  # a listed file that is also a listed file's directory: passed as present
    [{"path": "a", "sha256": "0" * 64, "sizeBytes": 0},
     {"path": "a/0", "sha256": "0" * 64, "sizeBytes": 0}], "oci", [("drop", 3)],
)  # fmt: skip
def test_check_tree(
    listed: list[dict[str, Any]], layout: str, edits: list[tuple[Any, ...]]
) -> None:
    doc = {**_BUNDLE, "layout": layout, "files": listed}
    data = s.utf8(json.dumps(doc, ensure_ascii=False))
    manifest = outcome("bundles.manifest.parse_manifest", lambda: parse_manifest(data))
    if not isinstance(manifest, BundleManifest):
        return  # a generated path the manifest refuses (the blob directory): not a tree input
    tree = _tree(manifest)
    _edit(tree, edits)
    must_refuse = _must_refuse(tree, manifest)
    result = outcome("bundles.tree_rules.check_tree", lambda: check_tree(iter(tree), manifest))
    if must_refuse:
        assert isinstance(result, BaseException), f"accepted a tree it must refuse: {edits!r}"
    else:
        assert result is None, f"refused a tree it must accept: {edits!r}: {result!r}"
