"""Fuzz: the node OS parsers (``nodeos``): os-release, ``bootc status --format json`` and
``rpm-ostree status --json`` as the tools might print them, damaged.

Contract: whatever the bytes, a value or ``MalformedInput``, never another exception, within
the CPU bound; every text the value carries is short and safe to show, and a digest is one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeagent.nodeos import (
    DIGEST_RE,
    BootedImage,
    booted_from_bootc,
    booted_from_rpm_ostree,
    os_image,
    parse_os_release,
)
from nodeagent.strict import MalformedInput
from tests.fuzz import strategies as s
from tests.fuzz.contract import check_text, outcome

FIXTURES = Path(__file__).parents[1] / "unit" / "nodeos" / "fixtures"
_BOOTC: dict[str, Any] = json.loads((FIXTURES / "bootc-status-booted.json").read_text())
_RPM_OSTREE: dict[str, Any] = json.loads(
    (FIXTURES / "rpm-ostree-status-container.json").read_text()
)


def _documents(base: dict[str, Any], paths: list[tuple[str | int, ...]]) -> Any:
    seeds = st.just(json.dumps(base).encode())
    return st.one_of(
        s.mutated(seeds),
        s.json_bytes(st.builds(s.replaced, st.just(base), st.sampled_from(paths), s.json_like)),
        s.raw_bytes,
    )


def _checked(found: BootedImage | None) -> None:
    if found is None:
        return
    for text in (found.image, found.version or ""):
        check_text(text, "an OS image text")
        assert len(text) <= 512
    assert found.digest is None or DIGEST_RE.fullmatch(found.digest)


@given(
    _documents(
        _BOOTC,
        [
            ("status", "booted"),
            ("status", "booted", "image"),
            ("status", "booted", "image", "image", "image"),
            ("status", "booted", "image", "imageDigest"),
            ("status", "booted", "image", "version"),
        ],
    )
)
def test_bootc_status(data: bytes) -> None:
    result = outcome(
        "nodeos.booted_from_bootc", lambda: booted_from_bootc(data), allowed=(MalformedInput,)
    )
    if not isinstance(result, BaseException):
        _checked(result)


@given(
    _documents(
        _RPM_OSTREE,
        [
            ("deployments",),
            ("deployments", 1),
            ("deployments", 1, "booted"),
            ("deployments", 1, "container-image-reference"),
            ("deployments", 1, "container-image-reference-digest"),
            ("deployments", 1, "version"),
        ],
    )
)
def test_rpm_ostree_status(data: bytes) -> None:
    result = outcome(
        "nodeos.booted_from_rpm_ostree",
        lambda: booted_from_rpm_ostree(data),
        allowed=(MalformedInput,),
    )
    if not isinstance(result, BaseException):
        _checked(result)


@given(s.edited_text([(FIXTURES / "os-release-rhcos").read_text()]))
def test_os_release(text: str) -> None:
    found = outcome("nodeos.parse_os_release", lambda: parse_os_release(text))
    assert isinstance(found, dict)
    for value in found.values():
        check_text(value, "an os-release value")
        assert len(value) <= 256
    assert os_image(text, bootc=None, rpm_ostree=None).to_json().keys() <= {
        "id",
        "versionId",
        "version",
        "prettyName",
    }
