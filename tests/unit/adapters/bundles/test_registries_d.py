"""The registries.d adapter: reads the directory as containers/image does (``*.yaml`` only,
its own drop-in left out), writes and removes the loopback mirror's drop-in."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.adapters.bundles.registries_d import DROPIN_NAME, RegistriesD
from nodeagent.bundles.signatures import parse_registries_d, uses_sigstore_attachments
from nodeagent.errors import ConfigInvalid, HostFileError

ON = "    use-sigstore-attachments: true\n"


def test_a_missing_directory_is_no_configuration(tmp_path: Path) -> None:
    scopes = RegistriesD(tmp_path / "absent").scopes()
    assert (scopes.default, dict(scopes.namespaces), scopes.problems) == (None, {}, ())


def test_only_yaml_files_are_read_and_the_drop_in_is_written_and_removed(tmp_path: Path) -> None:
    (tmp_path / "quay.yaml").write_text("docker:\n  quay.io:\n" + ON)
    (tmp_path / "notes.txt").write_text("not: [yaml")
    (tmp_path / "old.yaml.bak").write_text("default-docker: [broken")
    registries_d = RegistriesD(tmp_path)

    assert registries_d.write_mirror("127.0.0.1:43210") is True
    text = (tmp_path / DROPIN_NAME).read_text()
    mirror = parse_registries_d([(DROPIN_NAME, text.encode())])
    assert uses_sigstore_attachments(mirror, "127.0.0.1:43210/acme/app", "sha256:x")
    assert not uses_sigstore_attachments(mirror, "127.0.0.1:43211/acme/app", "sha256:x")

    scopes = registries_d.scopes()  # its own drop-in is not the admin's configuration
    assert (dict(scopes.namespaces), scopes.problems) == ({"quay.io": True}, ())
    assert registries_d.remove_mirror() is True
    assert registries_d.remove_mirror() is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "old.yaml.bak", "quay.yaml"]


def test_a_scope_another_file_sets_is_not_written_twice(tmp_path: Path) -> None:
    """Two files setting one scope make the runtime refuse the whole directory."""
    (tmp_path / "admin.yaml").write_text("docker:\n  127.0.0.1:43210:\n" + ON)
    assert RegistriesD(tmp_path).write_mirror("127.0.0.1:43210") is False
    assert not (tmp_path / DROPIN_NAME).exists()


def test_a_long_file_is_read_bounded_and_reported(tmp_path: Path) -> None:
    (tmp_path / "big.yaml").write_bytes(b"#" * (2 << 20))
    problems = RegistriesD(tmp_path).scopes().problems
    assert len(problems) == 1
    assert "big.yaml" in problems[0]


def test_an_unreadable_directory_is_a_host_file_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(HostFileError, match="cannot list"):
        RegistriesD(tmp_path / "file").scopes()


def test_the_drop_in_must_be_a_yaml_name() -> None:
    with pytest.raises(ConfigInvalid, match=r"NAME\.yaml"):
        RegistriesD(Path("/etc/containers/registries.d"), "mirror.conf")
