"""tests/capabilities.py: how a run's skips are judged (the rule ``make test`` enforces)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import capabilities as c


@pytest.fixture(autouse=True)
def probes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(c.PROBES, "here", c.Probe("here", "always there", lambda: None))
    monkeypatch.setitem(c.PROBES, "gone", c.Probe("gone", "never there", lambda: "not built"))
    c.absent.cache_clear()
    yield
    c.absent.cache_clear()


def test_a_skip_for_an_absent_probe_on_an_unknown_kind_is_not_judged() -> None:
    skipped = [c.Skipped("t::a", "[probe gone] not built")]
    assert c.judge(skipped, "no-such-kind") == []  # an unknown kind: absent probes not judged


def test_a_skip_without_a_probe_is_an_accident() -> None:
    (problem,) = c.judge([c.Skipped("t::a", "Skipped: just because")], "no-such-kind")
    assert "without a probe" in problem


def test_a_skip_for_a_probe_that_is_there_is_refused() -> None:
    (problem,) = c.judge([c.Skipped("t::a", "[probe here] it was not")], "no-such-kind")
    assert "which says it is there" in problem


def test_an_absent_probe_the_manifest_does_not_allow_fails_on_a_known_kind() -> None:
    problems = c.judge([c.Skipped("t::a", "[probe gone] not built")], "systemd-cgroup2")
    assert problems == [
        "probe gone is absent (not built), which tests/expected-skips.toml does not allow "
        "on a systemd-cgroup2 machine"
    ]


def test_the_manifest_names_only_probes_that_exist() -> None:
    for kind in ("container-cgroup1", "systemd-cgroup2", "rpm-check"):
        assert c.allowed_absent(kind) is not None


def test_skip_for_tags_the_reason_and_refuses_an_unknown_probe() -> None:
    with pytest.raises(pytest.skip.Exception, match=r"^\[probe gone\] not built$"):
        c.skip_for("gone")
    with pytest.raises(KeyError):
        c.skip_for("no-such-probe")
    c.skip_unless("here")  # there: no skip
