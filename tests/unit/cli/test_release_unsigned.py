"""``bundle create --release`` without a release signature (issue 28): it was accepted in
silence; the cluster-version operator then refuses the upgrade on a site that cannot fetch
the signature. Now a warning line, or a refusal with ``--require-signatures``."""

from __future__ import annotations

import argparse

import pytest

from nodeagent.cli.release import parse_release_ref, release_request
from nodeagent.errors import ReleaseUnsigned

RELEASE = parse_release_ref("quay.io/openshift-release-dev/ocp-release@sha256:" + "a" * 64)


def args(*, require: bool) -> argparse.Namespace:
    return argparse.Namespace(
        release=RELEASE, release_set_name=None, release_signature=[], signature_dir=None,
        require_signatures=require, from_version=None,
    )  # fmt: skip


def test_no_signature_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    request = release_request(args(require=False))
    assert request is not None and request.signatures == ()
    err = capsys.readouterr().err
    assert err.startswith("warning: ReleaseUnsigned: the release sha256:")
    assert "what to do: carry the release's signatures: --release-signature FILE" in err


def test_no_signature_is_refused_when_required() -> None:
    with pytest.raises(ReleaseUnsigned, match="without any release signature"):
        release_request(args(require=True))
