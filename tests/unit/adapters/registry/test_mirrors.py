"""registries.conf's mirrors as nodeagent reads manifests through them (containers/image's
rules: longest prefix, mirrors in order, the location last)."""

from __future__ import annotations

import pytest

from nodeagent.adapters.registry.mirrors import Route, pull_sources, routes_of
from nodeagent.errors import ConfigInvalid

D = "@sha256:" + "d" * 64

CONF = """
[[registry]]
location = "quay.io"
[[registry.mirror]]
location = "mirror.local:5000/quay"
[[registry.mirror]]
location = "backup.local/quay"

[[registry]]
prefix = "quay.io/openshift-release-dev"
location = "quay.io/openshift-release-dev"
[[registry.mirror]]
location = "mirror.local:5000/ocp"

[[registry]]
location = "docker.io/library"
[[registry.mirror]]
location = "mirror.local:5000/hub"

[[registry]]
prefix = "*.example.com"
location = "wild.example.com"
"""


def test_routes_of_reads_entries_and_a_later_file_replaces_an_entry_with_the_same_key() -> None:
    later = '[[registry]]\nlocation = "quay.io"\n[[registry.mirror]]\nlocation = "new.local/q"\n'
    routes = {r.prefix: r for r in routes_of([("main", CONF), ("10-later.conf", later)])}
    assert routes["quay.io"] == Route("quay.io", "quay.io", ("new.local/q",))
    assert routes["quay.io/openshift-release-dev"].mirrors == ("mirror.local:5000/ocp",)
    assert "*.example.com" not in routes  # wildcards are not followed


@pytest.mark.parametrize(
    ("ref", "sources"),
    [
        (
            "quay.io/team/app" + D,
            [
                "mirror.local:5000/quay/team/app" + D,
                "backup.local/quay/team/app" + D,
                "quay.io/team/app" + D,
            ],
        ),
        (
            "quay.io/openshift-release-dev/ocp-release" + D,
            [
                "mirror.local:5000/ocp/ocp-release" + D,
                "quay.io/openshift-release-dev/ocp-release" + D,
            ],
        ),
        (
            "docker.io/library/busybox" + D,
            ["mirror.local:5000/hub/busybox" + D, "docker.io/library/busybox" + D],
        ),
        ("busybox" + D, ["mirror.local:5000/hub/busybox" + D, "docker.io/library/busybox" + D]),
        ("quay.ioo/x" + D, ["quay.ioo/x" + D]),  # a prefix matches whole path segments only
        ("registry.local/x" + D, ["registry.local/x" + D]),
    ],
)
def test_pull_sources_follow_the_longest_prefix_mirrors_first(ref: str, sources: list[str]) -> None:
    assert pull_sources(ref, routes_of([("main", CONF)])) == sources


@pytest.mark.parametrize(
    "text",
    [
        "not toml [",
        "registry = 3",
        "[[registry]]\nlocation = 5",
        '[[registry]]\nlocation = "q.io"\nmirror = "x"',
        '[[registry]]\nlocation = "q.io"\n[[registry.mirror]]\nlocation = 7',
    ],
)
def test_files_or_entries_of_the_wrong_shape_are_refused_naming_the_file(text: str) -> None:
    with pytest.raises(ConfigInvalid, match=r"^RegistriesConfInvalid: 50-bad\.conf"):
        routes_of([("main", CONF), ("50-bad.conf", text)])


def test_wildcard_prefixes_route_nothing() -> None:
    text = '[[registry]]\nprefix = "*.example.com"\n[[registry.mirror]]\nlocation = "m.local"\n'
    assert routes_of([("main", text)]) == ()
