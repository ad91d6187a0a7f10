"""Unit tests of CRI-O pins: patterns, config files, the drop-in, runtime support, verification."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from nodeagent.errors import PinsOverridden, RuntimeDoesNotPin, RuntimeReloadFailed
from nodeagent.pins import (
    ConfigFile,
    PinService,
    PinSupport,
    check_pins,
    foreign_pins,
    pattern_matches,
    pin_support,
    pinned_images_of,
    render_dropin,
    support_problem,
)
from nodeagent.ports import StoredImage
from tests.fakes.clock import VirtualClock
from tests.fakes.crio import FakeCrio, MemoryDropins, crio_config
from tests.fakes.reloader import RecordingReloader

GOLDEN = Path(__file__).parent / "golden"
A = "quay.io/ns/app-a@sha256:" + "a" * 64
B = "quay.io/ns/app-b@sha256:" + "b" * 64
C = "quay.io/ns/app-c@sha256:" + "c" * 64


def assert_golden(name: str, text: str) -> None:
    """Compare with tests/unit/golden/<name>; NODEAGENT_UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    if os.environ.get("NODEAGENT_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()


# ---------------------------------------------------------------- pattern_matches
@pytest.mark.parametrize(
    ("pattern", "name", "is_match"),
    [
        # exact, case-insensitive, whole name only
        (A, A, True),
        (A.upper().replace("SHA256", "sha256"), A, True),
        ("quay.io/ns/app-a:1", "QUAY.IO/NS/APP-A:1", True),
        ("quay.io/ns/app-a", "quay.io/ns/app-a:1", False),
        ("quay.io/ns/app-a:1", "myquay.io/ns/app-a:1", False),
        ("*leading", "x-leading", False),  # a leading star alone is a literal star
        ("*leading", "*LEADING", True),
        ("", "quay.io/a", False),
        # trailing glob: case-insensitive search, NOT anchored at the start
        ("quay.io/x*", "quay.io/xyz", True),
        ("quay.io/x*", "quay.io/x", True),
        ("quay.io/x*", "myquay.io/xyz", True),
        ("quay.io/x*", "mirror.local/quay.io/x/y", True),
        ("QUAY.io/X*", "quay.io/xyz", True),
        ("quay.io/x*", "quay.io/y/x", False),
        ("quay.io/x*", "quayAio/xyz", False),  # the dot is literal, not a regexp dot
        ("a+b*", "a+bc", True),
        ("a+b*", "aabc", False),
        ("a[b]*", "a[b]c", True),
        # keyword
        ("*fedora*", "quay.io/crio/Fedora34:latest", True),
        ("*FEDORA*", "quay.io/crio/fedora34:latest", True),
        ("*fedora*", "quay.io/crio/ubuntu:latest", False),
        ("*.io/*", "quayXio/a", False),
        ("**", "anything", True),
        # a lone star: CRI-O panics on it; here it matches everything (documented)
        ("*", "quay.io/a", True),
    ],
)
def test_pattern_matches_like_crio(pattern: str, name: str, is_match: bool) -> None:
    assert pattern_matches(pattern, name) is is_match


# ---------------------------------------------------------------- pinned_images_of
@pytest.mark.parametrize(
    ("text", "pins"),
    [
        ("", None),
        ('log_level = "info"\n', None),
        ('[crio]\nroot = "/var/lib/containers"\n', None),
        ('[crio.image]\npause_image = "registry.k8s.io/pause:3.10"\n', None),
        ('pinned_images = ["top-level/is-ignored"]\n', None),
        ('[crio]\npinned_images = ["wrong/table"]\n', None),
        ('[crio.runtime]\npinned_images = ["wrong/table"]\n', None),
        ("[crio.image]\npinned_images = []\n", []),
        ('[crio.image]\npinned_images = ["b", "a"]\n', ["b", "a"]),
        ('[crio.image]\npinned_images = ["a", "", "b"]\n', ["a", "b"]),
        ('[crio.image]\npinned_images = [""]\n', []),
        ('[crio]\n[crio.image]\npinned_images = ["a"]\n', ["a"]),
        ('crio = { image = { pinned_images = ["inline"] } }\n', ["inline"]),
        ('[crio.image]\npinned_images = [\n  "multi",\n  "line",\n]\n', ["multi", "line"]),
    ],
)
def test_pinned_images_of_reads_only_crio_image_table(text: str, pins: list[str] | None) -> None:
    assert pinned_images_of(text) == pins


def test_pinned_images_of_raises_value_error_for_invalid_toml() -> None:
    with pytest.raises(ValueError, match="not valid TOML"):
        pinned_images_of("[crio.image\npinned_images = [")


@pytest.mark.parametrize(
    "text",
    [
        "crio = 1\n",
        '[crio]\nimage = "quay.io/x"\n',
        "[[crio]]\n",
        '[crio.image]\npinned_images = "quay.io/a"\n',
        "[crio.image]\npinned_images = [1, 2]\n",
        '[crio.image]\npinned_images = ["a", 1]\n',
    ],
)
def test_pinned_images_of_rejects_what_crio_cannot_decode(text: str) -> None:
    with pytest.raises(ValueError, match="must be"):
        pinned_images_of(text)


# ---------------------------------------------------------------- foreign_pins
def cfg(path: str, text: str, *, is_after_ours: bool = False) -> ConfigFile:
    return ConfigFile(path, text, is_after_ours=is_after_ours)


def test_foreign_pins_is_the_sorted_union_of_every_file() -> None:
    foreign = foreign_pins(
        [
            cfg("/etc/crio/crio.conf", crio_config(["z/main", "shared"])),
            cfg("/etc/crio/crio.conf.d/50-pinned-images", crio_config(["shared", "a/mcd*"])),
            cfg("/etc/crio/crio.conf.d/60-none", '[crio.runtime]\nlog_level = "info"\n'),
        ]
    )
    assert foreign.patterns == ("a/mcd*", "shared", "z/main")
    assert foreign.overriding_files == ()
    assert foreign.unreadable_files == ()


@pytest.mark.parametrize(
    ("text", "is_after_ours", "is_overriding"),
    [
        (crio_config(["x"]), True, True),
        (crio_config([]), True, True),  # an empty list replaces ours just the same
        (crio_config(["x"]), False, False),
        ('[crio.runtime]\nlog_level = "debug"\n', True, False),
        ('pinned_images = ["top-level"]\n', True, False),
        ("", True, False),
    ],
)
def test_a_file_overrides_ours_only_when_after_ours_and_setting_the_key(
    text: str, is_after_ours: bool, is_overriding: bool
) -> None:
    foreign = foreign_pins([cfg("/etc/crio/crio.conf.d/99-x", text, is_after_ours=is_after_ours)])
    assert foreign.overriding_files == (("/etc/crio/crio.conf.d/99-x",) if is_overriding else ())


def test_unreadable_files_are_listed_and_the_others_still_count() -> None:
    foreign = foreign_pins(
        [
            cfg("/d/10-broken", "[crio.image\n", is_after_ours=True),
            cfg("/d/20-wrong-type", '[crio.image]\npinned_images = "a"\n', is_after_ours=True),
            cfg("/d/30-good", crio_config(["good"]), is_after_ours=True),
        ]
    )
    assert foreign.unreadable_files == ("/d/10-broken", "/d/20-wrong-type")
    assert foreign.patterns == ("good",)
    assert foreign.overriding_files == ("/d/30-good",)


def test_a_lone_star_is_never_carried_because_it_crashes_crio() -> None:
    foreign = foreign_pins([cfg("/d/10-star", crio_config(["*", "**", "kept"]))])
    assert foreign.patterns == ("**", "kept")


# ---------------------------------------------------------------- render_dropin
def test_render_dropin_matches_golden_file() -> None:
    patterns = [B, "quay.io/openshift-release-dev/*", A, B, "*etcd*", "*", ""]
    assert_golden("pins-dropin.conf", render_dropin(patterns))


def test_render_dropin_of_nothing_matches_golden_file() -> None:
    assert_golden("pins-dropin-empty.conf", render_dropin([]))


@pytest.mark.parametrize(
    "patterns",
    [
        [],
        [A],
        [C, B, A, A],
        ['quay.io/with"quote*', "back\\slash", "ünïcode/näme"],
        ["tab\there", "new\nline", "bell\x07", "del\x7f", "cr\r", "ff\f", "bs\b", "nul\x00"],
        ['"', "\\", '\\"', "'", "'''", "#not-a-comment", "emoji 🙂", "\u2028sep"],
        [f"r.io/n/img{i}@sha256:{i:064x}" for i in range(500)],
    ],
)
def test_render_dropin_parses_back_to_the_sorted_unique_list(patterns: list[str]) -> None:
    text = render_dropin(patterns)
    assert pinned_images_of(text) == sorted(set(patterns))
    assert text.startswith("# Written by nodeagent.")


def test_render_dropin_is_linear_in_the_number_of_patterns() -> None:
    """tomlkit took 41 CPU-s for the 31,500 references of one 4 MiB spec file: on the event
    loop that starves the watchdog. Here 40,000 render well under a second."""
    patterns = [f"quay.io/ocp/art-dev@sha256:{i:064x}" for i in range(40_000)]
    started = time.process_time()
    text = render_dropin(patterns)
    assert time.process_time() - started < 1.0
    assert pinned_images_of(text) == sorted(patterns)


def test_render_dropin_is_independent_of_input_order() -> None:
    assert render_dropin([A, B, C]) == render_dropin([C, A, B, A])


# ---------------------------------------------------------------- runtime support
@pytest.mark.parametrize(
    ("name", "version", "support"),
    [
        ("cri-o", "1.27.9", PinSupport(False, False, False)),
        ("cri-o", "1.28.0", PinSupport(True, False, False)),
        ("cri-o", "1.29.3", PinSupport(True, False, False)),
        ("cri-o", "1.29.4", PinSupport(True, True, False)),
        ("cri-o", "1.29.6", PinSupport(True, True, False)),
        ("cri-o", "1.29.7", PinSupport(True, True, True)),
        ("cri-o", "1.30.0", PinSupport(True, True, False)),
        ("cri-o", "1.30.2", PinSupport(True, True, False)),
        ("cri-o", "1.30.3", PinSupport(True, True, True)),
        ("cri-o", "1.31.0", PinSupport(True, True, True)),
        ("cri-o", "v1.34.0", PinSupport(True, True, True)),
        ("cri-o", "1.34.0-dev", PinSupport(True, True, True)),
        ("cri-o", "2.0.0", PinSupport(True, True, True)),
        ("containerd", "1.7.3", PinSupport(False, False, False)),
        ("containerd", "2.0.0", PinSupport(False, False, False)),
        ("cri-o", "garbage", PinSupport(False, False, False)),
        ("cri-o", "1.30", PinSupport(False, False, False)),
        ("cri-o", "", PinSupport(False, False, False)),
    ],
)
def test_pin_support_by_runtime_version(name: str, version: str, support: PinSupport) -> None:
    assert pin_support(name, version) == support


@pytest.mark.parametrize(
    ("name", "version", "problem"),
    [
        ("cri-o", "1.27.9", "cri-o 1.27.9 does not support pinned_images; CRI-O 1.28.0 or later"),
        ("cri-o", "1.28.0", "cri-o 1.28.0 applies pins only when it restarts; upgrade CRI-O"),
        ("cri-o", "1.29.3", "cri-o 1.29.3 applies pins only when it restarts"),
        ("containerd", "1.7.3", "containerd 1.7.3 does not support pinned_images"),
        ("cri-o", "garbage", "cri-o garbage does not support pinned_images"),
        ("cri-o", "1.29.4", None),
        ("cri-o", "1.30.0", None),
        ("cri-o", "v1.34.0", None),
    ],
)
def test_support_problem_explains_what_to_do(name: str, version: str, problem: str | None) -> None:
    found = support_problem(name, version)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(problem)


# ---------------------------------------------------------------- check_pins
def image(*names: str, is_pinned: bool) -> StoredImage:
    tags = tuple(n for n in names if "@" not in n)
    digests = tuple(n for n in names if "@" in n)
    return StoredImage(f"id-{names[0]}", tags, digests, 100, is_pinned)


KEEP = "quay.io/keep/tool@sha256:" + "d" * 64
GONE = "quay.io/ns/gone@sha256:" + "e" * 64
STORE = [
    image(A, "quay.io/ns/app-a:1", is_pinned=True),  # tag and digest of one image
    image(B, is_pinned=False),
    image(C, is_pinned=True),
    image(KEEP, is_pinned=True),
    image(GONE, is_pinned=False),
]


X = "r.io/x@sha256:" + "f" * 64
NEVER = "r.io/never@sha256:" + "0" * 64
A_TAG = "quay.io/ns/app-a:1"


@pytest.mark.parametrize(
    ("wanted", "released", "patterns", "expected"),
    [
        # expected: (not pinned, still pinned, absent)
        ([A], [], [A], ([], [], [])),
        ([A, B], [], [A, B], ([B], [], [])),
        ([A, X], [], [A], ([], [], [X])),
        ([A.upper().replace("SHA256", "sha256")], [], [A], ([], [], [])),
        ([A], [C], [A], ([], [C], [])),  # released, still pinned, nothing covers it
        ([A], [KEEP], [A, "quay.io/keep/*"], ([], [], [])),  # covered by a glob: fine
        ([A], [KEEP], [A, "*KEEP*"], ([], [], [])),  # covered by a keyword, any case
        ([A], [GONE], [A], ([], [], [])),  # released and unpinned: done
        ([A], [NEVER], [A], ([], [], [])),  # released and absent
        ([A], [A], [A], ([], [], [])),  # released and wanted again: wanted wins
        ([A], [A_TAG], [A], ([], [], [])),  # another name of a wanted image
        ([], [C, KEEP], ["quay.io/keep*"], ([], [C], [])),
    ],
)
def test_check_pins(
    wanted: list[str],
    released: list[str],
    patterns: list[str],
    expected: tuple[list[str], list[str], list[str]],
) -> None:
    check = check_pins(STORE, wanted, released, patterns)
    not_pinned, still_pinned, absent = (tuple(names) for names in expected)
    assert (check.not_pinned, check.still_pinned, check.absent) == (
        not_pinned,
        still_pinned,
        absent,
    )
    assert check.is_settled is (not not_pinned and not still_pinned)


# ---------------------------------------------------------------- PinService
class Rig:
    """A PinService wired to an in-memory CRI-O, its files, a reloader and a virtual clock."""

    def __init__(
        self, runtime: FakeCrio | None = None, others: list[ConfigFile] | None = None
    ) -> None:
        self.clock = VirtualClock()
        self.runtime = runtime or FakeCrio()
        self.store = MemoryDropins(others or [])
        self.reloader = RecordingReloader(self.store, self.runtime)
        self.runtime.start(self.store.texts_in_crio_order())
        self.service = PinService(
            self.store,
            self.reloader,
            self.runtime,
            verify_timeout_s=30.0,
            sleep=self.clock.sleep,
            monotonic=self.clock.monotonic,
        )

    def pinned(self) -> dict[str, bool]:
        return self.runtime.pinned_names()


async def test_apply_writes_reloads_and_proves_the_pins() -> None:
    rig = Rig()
    rig.runtime.store(A)
    rig.runtime.store(B)
    outcome = await rig.service.apply([A])
    assert (outcome.is_changed, outcome.reload_path, rig.reloader.calls) == (True, "sighup", 1)
    assert outcome.check.is_settled
    assert outcome.patterns == (A,)
    assert pinned_images_of(rig.store.text or "") == [A]
    assert rig.pinned() == {A: True, B: False}


async def test_no_reload_when_the_bytes_are_unchanged() -> None:
    rig = Rig()
    rig.runtime.store(A)
    await rig.service.apply([A])
    again = await rig.service.apply([A])
    assert (again.is_changed, again.reload_path) == (False, None)
    assert (rig.reloader.calls, rig.store.writes) == (1, 2)
    assert again.check.is_settled


async def test_owed_reload_happens_once_even_when_the_bytes_are_unchanged() -> None:
    rig = Rig()
    rig.runtime.store(A)
    await rig.service.apply([A])
    rig.service.owe_reload()  # a restarted daemon cannot know whether it crashed before reloading
    again = await rig.service.apply([A])
    assert (again.is_changed, rig.reloader.calls) == (False, 2)
    third = await rig.service.apply([A])
    assert (third.reload_path, rig.reloader.calls) == (None, 2)


async def test_owed_reload_is_kept_for_the_first_write_that_may_reload() -> None:
    """At start (before READY=1) the daemon writes without reloading; the first sync reloads."""
    rig = Rig()
    rig.runtime.store(A)
    rig.service.owe_reload()
    await rig.service.write([A], is_runtime_running=False)
    assert rig.reloader.calls == 0
    first = await rig.service.apply([A])
    assert (first.is_changed, first.reload_path is not None, rig.reloader.calls) == (False, True, 1)


async def test_reload_when_the_wanted_pins_change() -> None:
    rig = Rig()
    rig.runtime.store(A)
    rig.runtime.store(B)
    await rig.service.apply([A])
    outcome = await rig.service.apply([A, B])
    assert (outcome.is_changed, rig.reloader.calls) == (True, 2)
    assert rig.pinned() == {A: True, B: True}


async def test_released_images_are_unpinned() -> None:
    rig = Rig()
    rig.runtime.store(A)
    rig.runtime.store(B)
    await rig.service.apply([A, B])
    outcome = await rig.service.apply([A], released=[B])
    assert outcome.check.is_settled
    assert rig.pinned() == {A: True, B: False}


async def test_verify_polls_with_backoff_until_the_runtime_reports_pins() -> None:
    rig = Rig(FakeCrio(lists_before_pins_apply=3))
    rig.runtime.store(A)
    outcome = await rig.service.apply([A])
    assert outcome.check.is_settled
    assert rig.runtime.list_calls == 4
    assert rig.clock.sleeps == pytest.approx([0.1, 0.2, 0.4])


async def test_verify_gives_up_at_the_timeout_and_explains() -> None:
    rig = Rig(FakeCrio(lists_before_pins_apply=10**6))
    rig.runtime.store(A)
    with pytest.raises(RuntimeDoesNotPin, match=r"cri-o 1\.34\.0 reloaded but still reports 1"):
        await rig.service.apply([A])
    assert 30.0 <= sum(rig.clock.sleeps) <= 32.0
    assert max(rig.clock.sleeps) == 2.0


async def test_foreign_pins_are_carried_and_stay_pinned() -> None:
    mcd = cfg("/etc/crio/crio.conf.d/50-pinned-images", crio_config([KEEP, "quay.io/ocp/*"]))
    rig = Rig(others=[mcd])
    for ref in (A, KEEP, "quay.io/ocp/release@sha256:" + "1" * 64, B):
        rig.runtime.store(ref)
    outcome = await rig.service.apply([A])
    assert outcome.patterns == tuple(sorted([A, KEEP, "quay.io/ocp/*"]))
    assert outcome.foreign.patterns == tuple(sorted([KEEP, "quay.io/ocp/*"]))
    pinned = rig.pinned()
    assert pinned[A] and pinned[KEEP] and pinned["quay.io/ocp/release@sha256:" + "1" * 64]
    assert not pinned[B]


async def test_released_image_still_covered_by_a_foreign_glob_is_not_reported() -> None:
    kept = "quay.io/ocp/release@sha256:" + "1" * 64
    mcd = cfg("/etc/crio/crio.conf.d/50-pinned-images", crio_config(["quay.io/ocp/*"]))
    rig = Rig(others=[mcd])
    rig.runtime.store(kept)
    await rig.service.apply([kept])
    outcome = await rig.service.apply([], released=[kept])
    assert outcome.check.still_pinned == ()
    assert rig.pinned() == {kept: True}
    assert rig.clock.sleeps == []  # settled at the first look


async def test_overriding_file_raises_pins_overridden() -> None:
    late = cfg("/etc/crio/crio.conf.d/99-late", crio_config(["other/x"]), is_after_ours=True)
    rig = Rig(others=[late])
    rig.runtime.store(A)
    with pytest.raises(PinsOverridden, match="99-late sort"):
        await rig.service.apply([A])
    assert rig.pinned() == {A: False}


async def test_overriding_file_that_covers_our_images_is_harmless() -> None:
    late = cfg("/etc/crio/crio.conf.d/99-late", crio_config(["quay.io/ns/*"]), is_after_ours=True)
    rig = Rig(others=[late])
    rig.runtime.store(A)
    outcome = await rig.service.apply([A])
    assert outcome.check.is_settled
    assert outcome.foreign.overriding_files == ("/etc/crio/crio.conf.d/99-late",)


@pytest.mark.parametrize(
    ("version", "is_pinning", "is_repin", "message"),
    [
        ("1.27.0", False, False, "cri-o 1.27.0 does not support pinned_images"),
        ("1.28.0", True, False, "cri-o 1.28.0 applies pins only when it restarts"),
    ],
)
async def test_runtime_that_cannot_pin_by_reload_raises_with_its_version(
    version: str, is_pinning: bool, is_repin: bool, message: str
) -> None:
    runtime = FakeCrio(version=version, is_pinning=is_pinning, is_repin_on_reload=is_repin)
    rig = Rig(runtime)
    rig.runtime.store(A)
    with pytest.raises(RuntimeDoesNotPin, match=message):
        await rig.service.apply([A])
    assert rig.reloader.calls == 1


async def test_failed_reload_is_retried_even_when_the_bytes_did_not_change() -> None:
    rig = Rig()
    rig.reloader.failures = 1
    rig.runtime.store(A)
    with pytest.raises(RuntimeReloadFailed):
        await rig.service.apply([A])
    outcome = await rig.service.apply([A])
    assert (outcome.is_changed, outcome.reload_path, rig.reloader.calls) == (False, "sighup", 2)
    assert outcome.check.is_settled
    third = await rig.service.apply([A])
    assert (third.reload_path, rig.reloader.calls) == (None, 2)


async def test_write_alone_does_not_verify() -> None:
    rig = Rig(FakeCrio(lists_before_pins_apply=10**6))
    rig.runtime.store(A)
    is_changed, path, foreign = await rig.service.write([A])
    assert (is_changed, path, foreign.patterns) == (True, "sighup", ())
    assert (rig.runtime.list_calls, rig.clock.sleeps) == (0, [])
