"""host_ca_files: a host's containers-certs.d(5) CA files, never outside the directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.adapters.registry.tls import host_ca_files


def test_a_host_s_crt_files_from_the_first_directory_that_has_the_host(tmp_path: Path) -> None:
    first, second = tmp_path / "containers", tmp_path / "docker"
    for root, names in (
        (first, ["b.crt", "a.crt", "client.cert", "client.key"]),
        (second, ["c.crt"]),
    ):
        (root / "mirror.example:5000").mkdir(parents=True)
        for name in names:
            (root / "mirror.example:5000" / name).write_text("x")
    (first / "other.example").mkdir()
    (first / "other.example" / "o.crt").write_text("x")
    found = host_ca_files((first, second), "mirror.example:5000")
    host = first / "mirror.example:5000"
    assert found == (host / "a.crt", host / "b.crt")
    assert host_ca_files((tmp_path / "none", second), "mirror.example:5000") == (
        second / "mirror.example:5000" / "c.crt",
    )
    assert host_ca_files((first, second), "absent.example") == ()


@pytest.mark.parametrize("host", ["", ".", "..", "../etc", "a/b", "a\\b", "a\0b"])
def test_a_host_that_is_not_a_directory_name_has_none(tmp_path: Path, host: str) -> None:
    (tmp_path / "certs.d").mkdir()
    (tmp_path / "x.crt").write_text("x")  # what ".." would reach
    assert host_ca_files((tmp_path / "certs.d",), host) == ()
