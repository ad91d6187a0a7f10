"""The node mirror drop-in on disk: written only when its bytes change, mode 0644, never
when the merge or another file breaks containers/image's rules, removed when nothing is
held (decision 0058)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from nodeagent.adapters.bundles.mirror import MirrorDropin
from nodeagent.adapters.bundles.node_mirror_dropin import (
    Held,
    NodeMirrorDropin,
    held_repositories,
    served_tag_repositories,
)
from nodeagent.adapters.host import registries_texts
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.registries import read_registries_conf
from nodeagent.store import layout
from nodeagent.store.layout import StoredImage
from tests.testenv.signed_bundles import HOST, Keys, image, signed_bundle, with_served_tags

DIGEST = "sha256:" + "a" * 64


def dropin(tmp_path: Path) -> NodeMirrorDropin:
    etc = tmp_path / "etc"
    (etc / "registries.conf.d").mkdir(parents=True, exist_ok=True)
    return NodeMirrorDropin(
        etc / "registries.conf.d" / "98-nodeagent-node-mirror.conf",
        etc / "registries.conf",
        "127.0.0.1:22626",
        own_names=("99-nodeagent-bundle-mirror.conf",),
    )


def test_holdings_are_the_repositories_of_the_store_index(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    assert held_repositories(store) == Held()
    images = [
        StoredImage(f"quay.io/org/app@{DIGEST}", DIGEST, 10, layout.INDEX_MEDIA_TYPE),
        StoredImage(f"docker.io/busybox@{DIGEST}", DIGEST, 10, layout.INDEX_MEDIA_TYPE),
        StoredImage("quay.io/org/app:latest", DIGEST, 10, layout.INDEX_MEDIA_TYPE),
    ]
    (store / layout.INDEX_NAME).write_bytes(layout.render_index(images))
    held = held_repositories(store)
    assert held.repositories == ("docker.io/library/busybox", "quay.io/org/app")
    assert held.skipped == 1  # a tag reference is no digest reference: never mirrored


def test_the_repositories_of_a_stored_bundle_s_served_tags_are_tagged(tmp_path: Path) -> None:
    """A ``--serve-tags`` bundle in the store: its tagged repository gets the ``tag-only``
    mirror in the drop-in (the daemon's own drop-in, not only the import's), the others not."""
    keys, cache = Keys.make(tmp_path / "trusted"), tmp_path / "cache"
    catalog = image("example/catalog", [(4096, 1)], cache)
    app = image("example/app", [(4096, 2)], cache)
    bundle = signed_bundle(
        tmp_path / "bundle", keys, [catalog, app], bundle_id="tagged", set_name="set-tagged"
    )
    bundle = with_served_tags(bundle, keys, {f"{HOST}/example/catalog:v1": catalog.digest})
    store = tmp_path / "store"
    copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    held = held_repositories(store)
    assert held.repositories == (f"{HOST}/example/app", f"{HOST}/example/catalog")
    assert held.tagged == frozenset({f"{HOST}/example/catalog"})
    text = dropin(tmp_path).render(held, read_registries_conf([]))
    tag_only = text.split('pull-from-mirror = "tag-only"')
    assert len(tag_only) == 2 and f'prefix = "{HOST}/example/catalog"' in tag_only[0]


def test_an_unrecorded_or_unreadable_bundle_serves_no_tag(tmp_path: Path) -> None:
    bundles = tmp_path / "store" / "bundles"
    tags = {f"{HOST}/example/catalog:v1": DIGEST}
    for name, text, is_recorded in (
        ("unrecorded", json.dumps({"servedTags": tags}), False),  # the record comes last
        ("broken", '{"servedTags": ', True),
        ("listed", json.dumps({"servedTags": ["not", "a", "mapping"]}), True),
        ("good", json.dumps({"servedTags": tags | {"no-digest:v2": "latest"}}), True),
    ):
        (bundles / name).mkdir(parents=True)
        (bundles / name / "bundle.json").write_text(text)
        if is_recorded:
            (bundles / name / "record.json").write_text("{}")
    assert served_tag_repositories(tmp_path / "store") == {f"{HOST}/example/catalog"}
    assert served_tag_repositories(tmp_path / "absent") == frozenset()


def test_written_once_0644_and_removed_when_nothing_is_held(tmp_path: Path) -> None:
    d = dropin(tmp_path)
    held = Held(("quay.io/org/app",))
    assert d.sync(held).action == "wrote"
    assert stat.S_IMODE(d.path.stat().st_mode) == 0o644
    assert d.sync(held).action == "unchanged"
    assert d.sync(Held()).action == "removed"
    assert d.sync(Held()).action == "absent"


def test_nodeagents_own_files_are_never_restated(tmp_path: Path) -> None:
    d = dropin(tmp_path)
    (d.path.parent / "99-nodeagent-bundle-mirror.conf").write_text(
        '[[registry]]\nprefix = "quay.io/org/app"\nlocation = "quay.io/org/app"\n'
        '[[registry.mirror]]\nlocation = "127.0.0.1:40000/org/app"\ninsecure = true\n'
    )
    d.path.write_text('[[registry]]\nlocation = "stale.example/x"\n')
    d.sync(Held(("quay.io/org/app",)))
    text = d.path.read_text()
    assert "40000" not in text and "stale.example" not in text


def test_a_malformed_file_of_another_component_is_reported_and_left_untouched(
    tmp_path: Path,
) -> None:
    d = dropin(tmp_path)
    d.sync(Held(("quay.io/org/app",)))
    before = d.path.read_bytes()
    bad = d.registries_conf
    bad.write_text(
        '[[registry]]\nlocation = "quay.io/org"\nmirror-by-digest-only = true\n'
        '[[registry.mirror]]\nlocation = "m.site/org"\npull-from-mirror = "digest-only"\n'
    )
    bad_bytes = bad.read_bytes()
    outcome = d.sync(Held(("quay.io/org/app", "quay.io/org/other")))
    assert (outcome.action, outcome.reason) == ("refused", "RegistriesConfInvalid")
    assert "refuses the two forms together" in outcome.message
    assert d.path.read_bytes() == before  # ours not rewritten
    assert bad.read_bytes() == bad_bytes  # theirs untouched


def test_a_merge_that_breaks_a_rule_is_never_written(tmp_path: Path) -> None:
    """Two held repositories whose existing entries rebase them onto one location, one
    blocked and one not: the drop-in would define that location twice with conflicting
    ``blocked``, which containers/image refuses."""
    d = dropin(tmp_path)
    d.registries_conf.write_text(
        '[[registry]]\nprefix = "a.example/x"\nlocation = "same.example/x"\nblocked = true\n'
        '[[registry]]\nprefix = "b.example/y"\nlocation = "same.example"\n'
    )
    outcome = d.sync(Held(("a.example/x/app", "b.example/y/x/app")))
    assert outcome.action == "refused"
    assert "98-nodeagent-node-mirror.conf" in outcome.message
    assert "conflicting 'blocked'" in outcome.message
    assert not d.path.exists()


def test_blocked_sources_are_reported(tmp_path: Path) -> None:
    d = dropin(tmp_path)
    d.registries_conf.write_text('[[registry]]\nlocation = "quay.io/org"\nblocked = true\n')
    outcome = d.sync(Held(("quay.io/org/app", "quay.io/other/app")))
    assert outcome.blocked == ("quay.io/org/app",)


def test_the_import_drop_in_restates_the_node_mirror_entry_after_its_own_mirror(
    tmp_path: Path,
) -> None:
    """The two files share prefixes; 99 (the import's) sorts last and replaces 98's entry,
    so it restates it: the import's mirror, then the node mirror, then the rest."""
    d = dropin(tmp_path)
    d.registries_conf.write_text(
        '[[registry]]\nlocation = "quay.io/org"\nblocked = true\n'
        '[[registry.mirror]]\nlocation = "mirror.site/org"\npull-from-mirror = "digest-only"\n'
    )
    d.sync(Held(("quay.io/org/app",)))
    importing = MirrorDropin(d.path.parent / "99-nodeagent-bundle-mirror.conf", d.registries_conf)
    importing.write(["quay.io/org/app"], "127.0.0.1:40000")
    read = read_registries_conf(registries_texts(d.registries_conf, d.path.parent))
    entry = next(e for e in read.entries if e.key == "quay.io/org/app")
    assert entry.is_blocked
    assert [m.location for m in entry.mirrors] == [
        "127.0.0.1:40000/org/app",
        "127.0.0.1:22626/org/app",
        "mirror.site/org/app",
    ]
    assert {m.pull_from_mirror for m in entry.mirrors} == {"digest-only"}
    importing.remove()  # the import ended: the node mirror's entry applies again
    d.sync(Held(("quay.io/org/app",)))
    read = read_registries_conf(registries_texts(d.registries_conf, d.path.parent))
    entry = next(e for e in read.entries if e.key == "quay.io/org/app")
    assert entry.mirrors[0].location == "127.0.0.1:22626/org/app"
