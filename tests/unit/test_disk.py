"""Unit tests of disk admission: reserve, bytes still to fetch, the verdict and its message."""

from __future__ import annotations

import pytest

from nodeagent.disk import (
    Admission,
    ImageLayers,
    admit,
    admit_sets,
    needed_bytes,
    present_digests,
    reserve_for,
    unique_missing_bytes,
)
from nodeagent.ports import FilesystemSpace

KIB, MIB, GIB = 1024, 1024**2, 1024**3


def layers(ref: str, config: int, *blobs: tuple[str, int], manifest: str = "") -> ImageLayers:
    return ImageLayers(ref, manifest or f"sha256:m-{ref}", config, tuple(blobs))


def space(available: int, total: int = 100 * GIB) -> FilesystemSpace:
    return FilesystemSpace("/var/lib/containers", total, available)


BASE = ("sha256:base", 100 * MIB)
APP_A = layers("r.io/a@sha256:1", 1 * KIB, BASE, ("sha256:a", 10 * MIB))
APP_B = layers("r.io/b@sha256:2", 2 * KIB, BASE, ("sha256:b", 20 * MIB))


# ---------------------------------------------------------------- reserve_for
@pytest.mark.parametrize(
    ("total", "reserve", "percent", "expected"),
    [
        (100 * GIB, 2 * GIB, 0.0, 2 * GIB),
        (100 * GIB, 2 * GIB, 5.0, 5 * GIB),
        (100 * GIB, 10 * GIB, 5.0, 10 * GIB),
        (100 * GIB, 0, 0.0, 0),
        (1000, 0, 2.5, 25),
        (999, 0, 10.0, 99),  # rounded down to whole bytes
        (0, GIB, 50.0, GIB),
    ],
)
def test_reserve_is_the_larger_of_absolute_and_relative(
    total: int, reserve: int, percent: float, expected: int
) -> None:
    assert reserve_for(total, reserve, percent) == expected


# ---------------------------------------------------------------- unique_missing_bytes
@pytest.mark.parametrize(
    ("missing", "present", "expected"),
    [
        ([], [], 0),
        ([APP_A], [], 1 * KIB + 110 * MIB),
        ([APP_A, APP_B], [], 3 * KIB + 130 * MIB),  # the shared base counts once
        ([APP_A, APP_B], ["sha256:base"], 3 * KIB + 30 * MIB),  # stored layers count zero
        ([APP_A], ["sha256:base", "sha256:a"], 1 * KIB),  # the config always counts
        ([APP_A, APP_A], [], 1 * KIB + 110 * MIB),  # one image listed twice counts once
        (
            [APP_A, layers("mirror.io/a@sha256:1", 1 * KIB, BASE, manifest=APP_A.manifest_digest)],
            [],
            1 * KIB + 110 * MIB,
        ),
        ([layers("r.io/dup", 0, ("sha256:x", 5), ("sha256:x", 5))], [], 5),
    ],
)
def test_unique_missing_bytes(
    missing: list[ImageLayers], present: list[str], expected: int
) -> None:
    assert unique_missing_bytes(missing, present) == expected


def test_present_digests_are_the_layers_of_stored_images() -> None:
    assert present_digests([APP_A, APP_B]) == {"sha256:base", "sha256:a", "sha256:b"}
    assert present_digests([]) == set()


@pytest.mark.parametrize(
    ("compressed", "factor", "expected"),
    [(100, 2.0, 200), (100, 1.0, 100), (3, 1.5, 4), (0, 2.0, 0)],
)
def test_needed_bytes_applies_the_expansion_factor(
    compressed: int, factor: float, expected: int
) -> None:
    assert needed_bytes(compressed, factor) == expected


# ---------------------------------------------------------------- admit
@pytest.mark.parametrize(
    ("needed", "available", "reserve", "is_admitted"),
    [
        (6 * GIB, 8 * GIB, 2 * GIB, True),  # exactly the reserve left: admitted
        (6 * GIB + 1, 8 * GIB, 2 * GIB, False),  # one byte into the reserve: refused
        (0, 8 * GIB, 2 * GIB, True),
        (0, 2 * GIB, 2 * GIB, True),
        (0, 2 * GIB - 1, 2 * GIB, False),  # already inside the reserve
        (10 * GIB, 8 * GIB, 0, False),
    ],
)
def test_admit_boundary(needed: int, available: int, reserve: int, is_admitted: bool) -> None:
    verdict = admit(needed, space(available), reserve)
    assert verdict == Admission(is_admitted, needed, available, reserve)


@pytest.mark.parametrize(
    ("needed", "available", "reserve", "text"),
    [
        (
            1 * GIB,
            4 * GIB,
            2 * GIB,
            "fits: needs 1 GiB, 4 GiB available on the image filesystem, 2 GiB must stay free",
        ),
        (
            3 * GIB,
            4 * GIB,
            2 * GIB,
            "not enough disk space: needs 3 GiB, 4 GiB available on the image filesystem, "
            "2 GiB must stay free; free at least 1 GiB more",
        ),
        (
            1536 * MIB,
            512 * MIB,
            0,
            "not enough disk space: needs 1.5 GiB, 512 MiB available on the image filesystem, "
            "0 B must stay free; free at least 1 GiB more",
        ),
        (
            2 * GIB + 1,
            4 * GIB,
            2 * GIB,
            "not enough disk space: needs 2 GiB, 4 GiB available on the image filesystem, "
            "2 GiB must stay free; free at least 1 B more",
        ),
    ],
)
def test_admission_describes_itself_in_human_units(
    needed: int, available: int, reserve: int, text: str
) -> None:
    assert admit(needed, space(available), reserve).describe() == text


# ---------------------------------------------------------------- admit_sets
def image(ref: str, *blobs: tuple[str, int]) -> ImageLayers:
    return layers(ref, 0, *blobs)


def test_admit_sets_admits_everything_that_fits_and_reports_the_total() -> None:
    verdict = admit_sets(
        {"b": [APP_B], "a": [APP_A]}, [], space(10 * GIB), reserve_bytes=GIB, expansion_factor=2.0
    )
    assert (verdict.admitted, verdict.refused) == (("a", "b"), ())
    assert verdict.total.needed_bytes == 2 * (3 * KIB + 130 * MIB)
    assert verdict.total.is_admitted


def test_admit_sets_is_greedy_in_name_order() -> None:
    # 10 GiB available, 1 GiB reserve: 9 GiB to spend, factor 1.
    verdict = admit_sets(
        {
            "c-small": [image("r/c", ("sha256:c", 1 * GIB))],
            "a-big": [image("r/a", ("sha256:a", 7 * GIB))],
            "b-medium": [image("r/b", ("sha256:b", 3 * GIB))],
            "d-exact": [image("r/d", ("sha256:d", 1 * GIB))],
        },
        [],
        space(10 * GIB),
        reserve_bytes=GIB,
        expansion_factor=1.0,
    )
    # a (7) fits; b (7+3) does not; c (7+1) fits; d (7+1+1 = 9) fits exactly.
    assert verdict.admitted == ("a-big", "c-small", "d-exact")
    assert verdict.refused == ("b-medium",)
    assert not verdict.total.is_admitted
    assert verdict.total.needed_bytes == 12 * GIB


def test_layers_shared_across_sets_are_claimed_once() -> None:
    shared = ("sha256:shared", 4 * GIB)
    verdict = admit_sets(
        {
            "one": [image("r/one", shared, ("sha256:1", GIB))],
            "two": [image("r/two", shared, ("sha256:2", GIB))],
        },
        [],
        space(7 * GIB),
        reserve_bytes=GIB,
        expansion_factor=1.0,
    )
    # Counted twice the shared layer would need 10 GiB; counted once it needs 6 GiB.
    assert (verdict.admitted, verdict.refused) == (("one", "two"), ())
    assert verdict.total.needed_bytes == 6 * GIB


def test_present_layers_are_not_claimed() -> None:
    verdict = admit_sets(
        {"one": [image("r/one", ("sha256:stored", 8 * GIB), ("sha256:new", GIB))]},
        ["sha256:stored"],
        space(3 * GIB),
        reserve_bytes=GIB,
        expansion_factor=2.0,
    )
    assert verdict.admitted == ("one",)
    assert verdict.total.needed_bytes == 2 * GIB


def test_every_set_refused_when_nothing_fits() -> None:
    verdict = admit_sets(
        {"x": [image("r/x", ("sha256:x", 5 * GIB))], "y": [image("r/y", ("sha256:y", 5 * GIB))]},
        [],
        space(4 * GIB),
        reserve_bytes=0,
        expansion_factor=1.0,
    )
    assert (verdict.admitted, verdict.refused) == ((), ("x", "y"))
    assert verdict.total.describe().endswith("free at least 6 GiB more")


def test_admit_sets_of_nothing_admits_nothing() -> None:
    verdict = admit_sets({}, [], space(GIB), reserve_bytes=0, expansion_factor=2.0)
    assert (verdict.admitted, verdict.refused, verdict.total.needed_bytes) == ((), (), 0)
