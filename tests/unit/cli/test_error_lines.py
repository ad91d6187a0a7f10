"""Every error line names its file once, then the problem, then what to do.

A set of broken inputs (a bad configuration, bad set files, a bad bundle path, a bad
signing key, a bad auth file), each run through ``nodeagent``'s real entry point; every
``error:``/``warning:`` line on stderr must name the file exactly once and end with
``what to do:`` and a hint.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.bundles import minisign
from nodeagent.cli import main as cli
from nodeagent.cli import output

DIGEST = "sha256:" + "a" * 64
SET_HEAD = "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\n"


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(("error:", "warning:"))]


def check_lines(err: str, path: Path, reason: str) -> None:
    lines = error_lines(err)
    assert lines, err
    for line in lines:
        assert line.count(str(path)) == 1, line
        head, _, hint = line.partition("; what to do: ")
        assert hint.strip(), line
        assert head.index(reason) < head.index(str(path)), line  # reason, file, problem


Case = Callable[[Path], tuple[list[str], Path, str, int]]


def bad_toml(tmp: Path) -> tuple[list[str], Path, str, int]:
    path = tmp / "etc/bad.toml"
    path.write_text("[runtime\n")
    return ["check-config", "--config", "/etc/bad.toml"], path, "ConfigInvalid", 78


def unknown_key(tmp: Path) -> tuple[list[str], Path, str, int]:
    path = tmp / "etc/unknown.toml"
    path.write_text("[runtime]\nbogus = 1\n")
    return ["check-config", "--config", "/etc/unknown.toml"], path, "ConfigInvalid", 78


def spec_not_yaml(tmp: Path) -> tuple[list[str], Path, str, int]:
    path = tmp / "etc/nodeagent/pinnedimagesets.d/broken.yaml"
    path.write_text("x: [\n")
    return ["check-config"], path, "SpecInvalid", 65


def spec_by_tag(tmp: Path) -> tuple[list[str], Path, str, int]:
    path = tmp / "etc/nodeagent/pinnedimagesets.d/tagged.yaml"
    path.write_text(SET_HEAD + "metadata: {name: a}\nspec: {pinnedImages: [{name: 'q/a:1'}]}\n")
    return ["check-config"], path, "ImageReferenceInvalid", 65


def spec_wrong_kind(tmp: Path) -> tuple[list[str], Path, str, int]:
    path = tmp / "etc/nodeagent/pinnedimagesets.d/kind.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    return ["check-config"], path, "SpecInvalid", 65


def bundle_missing(tmp: Path) -> tuple[list[str], Path, str, int]:
    path = tmp / "no-such-bundle"
    return ["bundle", "verify", str(path)], path, "HostFileError", 74


def bundle_empty(tmp: Path) -> tuple[list[str], Path, str, int]:
    path = tmp / "empty-bundle"
    path.mkdir()
    return ["bundle", "verify", str(path)], path, "BundleIncomplete", 65


def stored_bundle_missing(tmp: Path) -> tuple[list[str], Path, str, int]:
    path = tmp / "gone"
    return ["bundle", "release-signatures", str(path)], path, "BundleIncomplete", 65


def create_args(tmp: Path, key: Path, *more: str) -> list[str]:
    out = tmp / "out"
    return ["bundle", "create", "--key", str(key), "--output", str(out), *more]


def key_missing(tmp: Path) -> tuple[list[str], Path, str, int]:
    key = tmp / "no.key"
    return create_args(tmp, key, "--image", f"r.test/a@{DIGEST}"), key, "SigningKeyMalformed", 78


def key_garbage(tmp: Path) -> tuple[list[str], Path, str, int]:
    key = tmp / "garbage.key"
    key.write_text("untrusted comment: x\nnot base64!\n")
    return create_args(tmp, key, "--image", f"r.test/a@{DIGEST}"), key, "SigningKeyMalformed", 78


def secret_key(tmp: Path) -> Path:
    _public, secret = minisign.generate_keypair(comment="error lines")
    key = tmp / "good.key"
    key.write_text(secret)
    return key


def auth_bad(tmp: Path) -> tuple[list[str], Path, str, int]:
    auth = tmp / "auth.json"
    auth.write_text('{"auths": 3}')
    argv = create_args(
        tmp, secret_key(tmp), "--auth-file", str(auth), "--image", f"r.test/a@{DIGEST}"
    )
    return argv, auth, "AuthFileInvalid", 78


def auth_missing(tmp: Path) -> tuple[list[str], Path, str, int]:
    auth = tmp / "no-auth.json"
    argv = create_args(
        tmp, secret_key(tmp), "--auth-file", str(auth), "--image", f"r.test/a@{DIGEST}"
    )
    return argv, auth, "AuthFileInvalid", 78


def set_file_bad(tmp: Path) -> tuple[list[str], Path, str, int]:
    path = tmp / "set.yaml"
    path.write_text(SET_HEAD + "metadata: {name: a}\nspec: {pinnedImages: [{name: 'q/a:1'}]}\n")
    argv = create_args(tmp, secret_key(tmp), "--pinned-image-set", str(path))
    return argv, path, "SpecInvalid", 65


CASES: list[Case] = [
    bad_toml, unknown_key, spec_not_yaml, spec_by_tag, spec_wrong_kind, bundle_missing,
    bundle_empty, stored_bundle_missing, key_missing, key_garbage, auth_bad, auth_missing,
    set_file_bad,
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_an_error_names_its_file_once_then_says_what_to_do(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "etc/nodeagent/pinnedimagesets.d").mkdir(parents=True)
    argv, path, reason, code = case(tmp_path)
    assert cli.main([*argv, "--root", str(tmp_path)]) == code
    err = capsys.readouterr().err
    check_lines(err, path, reason)
    assert f"what to do: {output.hint_for(reason)}" in err


def test_a_reason_without_a_hint_of_its_own_points_at_the_docs() -> None:
    line = output.error_line("SomethingNew", "it broke")
    assert (
        line == "error: SomethingNew: it broke; what to do: look SomethingNew up in "
        "docs/cli.md, 'Errors'"
    )


def test_docs_list_every_hint() -> None:
    docs = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text()
    for reason, hint in output.HINTS.items():
        cell = hint.replace("|", "\\|")
        assert f"| `{reason}` | {cell} |" in docs, reason


def test_attacker_text_in_an_error_line_is_escaped() -> None:
    line = output.error_line("SpecInvalid", "set 'a\x1b[2J' is bad")
    assert "\x1b" not in line and "a\\x1b[2J" in line
