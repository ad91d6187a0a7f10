"""Unit tests of PinnedImageSet parsing: single files, directories, duplicates, fingerprints."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.references import parse_pinned_image_ref
from nodeagent.specs import (
    PinnedImageSet,
    SpecLoad,
    file_stem,
    load_spec_dirs,
    parse_spec_text,
    set_fingerprint,
)

API = "machineconfiguration.openshift.io/v1"


def ref(n: int, host: str = "quay.io") -> str:
    return f"{host}/ns/app{n}@sha256:{n:064x}"


def pis(name: object, images: list[str], **extra: Any) -> dict[str, Any]:
    """A PinnedImageSet object; ``extra`` overrides top-level fields (``None`` removes one)."""
    obj: dict[str, Any] = {
        "apiVersion": API,
        "kind": "PinnedImageSet",
        "metadata": {"name": name},
        "spec": {"pinnedImages": [{"name": image} for image in images]},
    }
    obj.update(extra)
    return {key: value for key, value in obj.items() if value is not None}


def dump(*objects: Any) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


def parse(text: str, source: str = "/specs/a.yaml", *, is_persistent: bool = True) -> SpecLoad:
    return parse_spec_text(text, source=source, is_persistent=is_persistent)


def test_good_multi_document_file_loads_every_set() -> None:
    first = pis("first", [ref(1), ref(2, "127.0.0.1:5000")])
    first["metadata"].update(labels={"pool": "worker"}, generation=3, uid="ignored")
    load = parse(dump(first, pis("second", [ref(3)])), is_persistent=False)
    assert load.problems == ()
    assert [s.name for s in load.sets] == ["first", "second"]
    one = load.sets[0]
    assert one.images == (
        parse_pinned_image_ref(ref(1)),
        parse_pinned_image_ref(ref(2, "127.0.0.1:5000")),
    )
    assert dict(one.labels) == {"pool": "worker"}
    assert (one.generation, one.source, one.is_persistent) == (3, "/specs/a.yaml", False)
    assert (load.sets[1].generation, dict(load.sets[1].labels)) == (None, {})


def test_list_kind_spreads_its_items() -> None:
    text = dump(
        {"apiVersion": "v1", "kind": "List", "items": [pis("a", [ref(1)]), pis("b", [ref(2)])]}
    )
    load = parse(text)
    assert ([s.name for s in load.sets], load.problems) == (["a", "b"], ())


@pytest.mark.parametrize("text", ["", "---\n", "---\n---\n", "# only a comment\n"])
def test_empty_documents_are_skipped(text: str) -> None:
    load = parse(text + dump(pis("a", [ref(1)])) + "---\n")
    assert ([s.name for s in load.sets], load.problems) == (["a"], ())


@pytest.mark.parametrize(
    "text",
    ["", "---\n", "# saving...\n", "\n\n", "---\n---\n", '{"kind": "List", "items": []}'],
)
def test_a_file_that_holds_no_set_is_a_problem_not_a_removal(text: str) -> None:
    """An editor saving in place leaves the file empty for a moment: that is no removal."""
    load = parse(text)
    assert load.sets == ()
    [problem] = load.problems
    assert (problem.source, problem.object_name, problem.reason) == (
        "/specs/a.yaml",
        None,
        "SpecInvalid",
    )
    assert "holds no PinnedImageSet" in problem.message
    assert "remove the file to unpin" in problem.message


def too_many(count: int) -> list[str]:
    return [ref(n) for n in range(count)]


# (bad object, its name as reported, reason code, what the message must say)
BAD_SETS: list[tuple[Any, str | None, str, str]] = [
    (
        pis("bad", [ref(1), "quay.io/app:1.0"]),
        "bad",
        "ImageReferenceInvalid",
        "PinnedImageSet 'bad': spec.pinnedImages[1]: quay.io/app:1.0 is a tag reference",
    ),
    (
        pis("bad", [ref(1), "quay.io/a/b/c@sha256:" + "a" * 64]),
        "bad",
        "ImageReferenceInvalid",
        "spec.pinnedImages[1]: quay.io/a/b/c@sha256:",
    ),
    (
        pis("bad", [ref(1), ref(2), ref(1)]),
        "bad",
        "SpecInvalid",
        f"spec.pinnedImages[2] ({ref(1)}) duplicates spec.pinnedImages[0]",
    ),
    (
        pis("bad", []),
        "bad",
        "SpecInvalid",
        "spec.pinnedImages has 0 entries; it must have 1 to 500",
    ),
    (pis("bad", too_many(501)), "bad", "SpecInvalid", "has 501 entries; it must have 1 to 500"),
    (
        pis(None, [ref(1)]),
        None,
        "SpecInvalid",
        "PinnedImageSet (unnamed): metadata.name is missing",
    ),
    (pis("Bad_Name", [ref(1)]), "Bad_Name", "SpecInvalid", "'Bad_Name' is not a DNS subdomain"),
    (pis("a" * 254, [ref(1)]), "a" * 254, "SpecInvalid", "is not a DNS subdomain"),
    (pis(7, [ref(1)]), None, "SpecInvalid", "metadata.name must be a string, got 7"),
    (
        pis("bad", [ref(1)], spec={"pinnedImages": [{"name": ref(1)}], "nodeSelector": {}}),
        "bad",
        "SpecInvalid",
        "unknown field spec.nodeSelector (allowed: spec.pinnedImages)",
    ),
    (
        pis("bad", [], spec={"pinnedImages": [{"name": ref(1), "pull": "always"}]}),
        "bad",
        "SpecInvalid",
        "spec.pinnedImages[0]: unknown field pull (allowed: name)",
    ),
    (pis("bad", [ref(1)], status={}), "bad", "SpecInvalid", "unknown field status"),
    (
        pis("bad", [ref(1)], apiVersion="machineconfiguration.openshift.io/v1alpha1"),
        "bad",
        "SpecInvalid",
        "apiVersion 'machineconfiguration.openshift.io/v1alpha1' kind 'PinnedImageSet' is not a",
    ),
    (
        pis("bad", [ref(1)], kind="MachineConfig"),
        "bad",
        "SpecInvalid",
        "kind 'MachineConfig' is not",
    ),
    (pis("bad", [ref(1)], spec=None), "bad", "SpecInvalid", "spec must be a mapping, got missing"),
    (
        pis("bad", [], spec={"pinnedImages": ref(1)}),
        "bad",
        "SpecInvalid",
        "spec.pinnedImages must be a list, got a str",
    ),
    (
        pis("bad", [], spec={"pinnedImages": [ref(1)]}),
        "bad",
        "SpecInvalid",
        "spec.pinnedImages[0] must be a mapping with a string 'name'",
    ),
    (
        pis("bad", [ref(1)], metadata={"name": "bad", "labels": {"on": True}}),
        "bad",
        "SpecInvalid",
        "metadata.labels entry 'on': True must map a string to a string",
    ),
    (
        pis("bad", [ref(1)], metadata={"name": "bad", "generation": -1}),
        "bad",
        "SpecInvalid",
        "metadata.generation must be a non-negative integer, got -1",
    ),
    (["not", "an", "object"], None, "SpecInvalid", "a document is a list"),
]


@pytest.mark.parametrize(("bad", "object_name", "reason", "fragment"), BAD_SETS)
def test_bad_set_is_a_problem_while_the_good_one_next_to_it_loads(
    bad: Any, object_name: str | None, reason: str, fragment: str
) -> None:
    load = parse(dump(pis("good", [ref(1)]), bad))
    assert [s.name for s in load.sets] == ["good"]
    assert len(load.problems) == 1
    problem = load.problems[0]
    assert (problem.source, problem.object_name, problem.reason) == (
        "/specs/a.yaml",
        object_name,
        reason,
    )
    assert problem.message.startswith("/specs/a.yaml: ")
    assert fragment in problem.message


def test_five_hundred_images_are_allowed() -> None:
    load = parse(dump(pis("big", too_many(500))))
    assert (len(load.sets[0].images), load.problems) == (500, ())


@pytest.mark.parametrize("text", ["a: [\n", "- a\nb: c\n", "key: 'unterminated\n"])
def test_invalid_yaml_makes_the_whole_file_one_problem(text: str) -> None:
    load = parse(dump(pis("good", [ref(1)])) + "---\n" + text)
    assert load.sets == ()
    assert len(load.problems) == 1
    assert load.problems[0].object_name is None
    assert load.problems[0].reason == "SpecInvalid"
    assert load.problems[0].message.startswith("/specs/a.yaml is not valid YAML: ")
    assert " at line " in load.problems[0].message


def test_set_defined_twice_in_one_file_keeps_the_first() -> None:
    load = parse(dump(pis("x", [ref(1)]), pis("x", [ref(2)])))
    assert [s.images for s in load.sets] == [(parse_pinned_image_ref(ref(1)),)]
    assert [p.message for p in load.problems] == [
        "PinnedImageSet 'x' is defined twice in /specs/a.yaml; keeping the first"
    ]


# ---------------------------------------------------------------- directories


def write(path: Path, *objects: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(*objects))
    return path


def test_duplicate_set_across_files_keeps_the_first_file(tmp_path: Path) -> None:
    a = write(tmp_path / "d/a.yaml", pis("x", [ref(1)]))
    b = write(tmp_path / "d/b.yaml", pis("x", [ref(2)]), pis("y", [ref(3)]))
    load = load_spec_dirs([(tmp_path / "d", True)])
    assert [(s.name, s.source) for s in load.sets] == [("x", str(a)), ("y", str(b))]
    assert [(p.source, p.object_name, p.reason, p.message) for p in load.problems] == [
        (
            str(b),
            "x",
            "SpecInvalid",
            f"PinnedImageSet 'x' in {b} is also defined in {a}; keeping {a}",
        )
    ]


def test_persistent_directory_wins_over_transient_whatever_the_file_names(tmp_path: Path) -> None:
    kept = write(tmp_path / "etc/z.yaml", pis("x", [ref(1)]))
    write(tmp_path / "run/a.yaml", pis("x", [ref(2)]), pis("t", [ref(3)]))
    load = load_spec_dirs([(tmp_path / "etc", True), (tmp_path / "run", False)])
    assert [(s.name, s.source, s.is_persistent) for s in load.sets] == [
        ("x", str(kept), True),
        ("t", str(tmp_path / "run/a.yaml"), False),
    ]
    assert [p.object_name for p in load.problems] == ["x"]


@pytest.mark.parametrize(
    ("names", "loaded"),
    [
        (["b.yaml", "a.yml"], ["a.yml", "b.yaml"]),
        (["a.yaml", "b.json", "c.yaml.bak", ".d.yaml", "e.YAML"], ["a.yaml"]),
        (["sub/a.yaml", "b.yaml"], ["b.yaml"]),
        ([], []),
    ],
)
def test_only_yaml_files_in_lexical_order_without_recursion(
    tmp_path: Path, names: list[str], loaded: list[str]
) -> None:
    for index, name in enumerate(names):
        write(tmp_path / "d" / name, pis(f"set{index}", [ref(index)]))
    (tmp_path / "d").mkdir(exist_ok=True)
    load = load_spec_dirs([(tmp_path / "d", True)])
    assert [Path(s.source).name for s in load.sets] == loaded
    assert load.problems == ()


def test_missing_directory_holds_no_sets(tmp_path: Path) -> None:
    assert load_spec_dirs([(tmp_path / "absent", True), (tmp_path / "gone", False)]) == SpecLoad()


def test_unreadable_file_is_a_problem_and_the_others_load(tmp_path: Path) -> None:
    write(tmp_path / "d/a.yaml", pis("a", [ref(1)]))
    (tmp_path / "d/b.yaml").symlink_to(tmp_path / "nowhere.yaml")
    (tmp_path / "d/c.yaml").write_bytes(b"\xff\xfe not utf-8")
    load = load_spec_dirs([(tmp_path / "d", True)])
    assert [s.name for s in load.sets] == ["a"]
    assert [(Path(p.source).name, p.object_name) for p in load.problems] == [
        ("b.yaml", None),
        ("c.yaml", None),
    ]
    assert "cannot read" in load.problems[0].message
    assert "is not UTF-8 text" in load.problems[1].message


def test_a_file_where_a_directory_should_be_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "d").write_text("")
    load = load_spec_dirs([(tmp_path / "d", True)])
    assert (load.sets, [p.source for p in load.problems]) == ((), [str(tmp_path / "d")])


# ---------------------------------------------------------------- fingerprints


def image_set(*images: str, name: str = "s") -> PinnedImageSet:
    return PinnedImageSet(name=name, images=tuple(parse_pinned_image_ref(i) for i in images))


@pytest.mark.parametrize(
    ("left", "right", "is_same"),
    [
        (image_set(ref(1), ref(2)), image_set(ref(1), ref(2)), True),
        (image_set(ref(1), ref(2)), image_set(ref(2), ref(1)), True),
        (image_set(ref(1), name="a"), image_set(ref(1), name="b"), True),
        (image_set(ref(1), ref(2)), image_set(ref(1), ref(3)), False),
        (image_set(ref(1), ref(2)), image_set(ref(1)), False),
        (image_set(ref(1)), image_set(ref(1, "quay.io:443")), False),
    ],
)
def test_fingerprint_depends_on_the_images_only(
    left: PinnedImageSet, right: PinnedImageSet, is_same: bool
) -> None:
    assert (set_fingerprint(left) == set_fingerprint(right)) is is_same
    assert len(set_fingerprint(left)) == 64


def test_fingerprint_is_sha256_of_the_sorted_references_one_per_line() -> None:
    expected = hashlib.sha256(f"{ref(1)}\n{ref(2)}".encode()).hexdigest()
    assert set_fingerprint(image_set(ref(2), ref(1))) == expected


@pytest.mark.parametrize(
    ("name", "expected_length", "is_hashed"),
    [
        ("apps", 4, False),
        ("a" * 183, 183, False),
        ("a" * 184, 200, True),
        ("a" * 253, 200, True),
        ("é" * 120, 200, True),  # 240 bytes: cut on a character boundary
    ],
)
def test_file_stem_keeps_short_names_and_hash_suffixes_long_ones(
    name: str, expected_length: int, is_hashed: bool
) -> None:
    stem = file_stem(name)
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    assert stem.endswith("-" + digest) is is_hashed
    assert (stem == name) is not is_hashed
    assert len(stem.encode()) <= expected_length
    assert file_stem(name) == stem  # stable


def test_file_stem_tells_long_names_with_a_common_prefix_apart() -> None:
    assert file_stem("a" * 252 + "b") != file_stem("a" * 252 + "c")
