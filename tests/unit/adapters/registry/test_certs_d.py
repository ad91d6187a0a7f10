"""host_certs: a host's containers-certs.d(5) files, never outside the directory; a client
certificate without its key (or a key without its certificate) is a reason, not a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.adapters.registry.tls import (
    MAX_CERTS_FILE_BYTES,
    MAX_HOST_FILES,
    HostCerts,
    HostContexts,
    host_certs,
)
from nodeagent.errors import RegistryCertsInvalid

HOST = "mirror.example:5000"


def _lay_out(root: Path, names: list[str], text: str = "x") -> Path:
    (root / HOST).mkdir(parents=True)
    for name in names:
        (root / HOST / name).write_text(text)
    return root / HOST


def test_a_host_s_files_from_the_first_directory_that_has_the_host(tmp_path: Path) -> None:
    first, second = tmp_path / "containers", tmp_path / "docker"
    host = _lay_out(first, ["b.crt", "a.crt", "z.cert", "z.key", "b.cert", "b.key", "notes"])
    _lay_out(second, ["c.crt"])
    (first / "other.example").mkdir()
    (first / "other.example" / "o.crt").write_text("x")
    found = host_certs((first, second), HOST)
    assert found == HostCerts(
        host, (host / "a.crt", host / "b.crt"), (host / "b.cert", host / "b.key")
    )
    assert host_certs((tmp_path / "none", second), HOST).cas == (second / HOST / "c.crt",)
    assert host_certs((first, second), "absent.example") == HostCerts()


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (["ca.crt", "client.cert"], "client certificate 'client.cert' has no key 'client.key'"),
        (["ca.crt", "client.key"], "key 'client.key' has no client certificate 'client.cert'"),
        (["client.cert", "other.key"], "client certificate 'client.cert' has no key"),
    ],
)
def test_half_a_client_pair_is_a_reason(tmp_path: Path, names: list[str], problem: str) -> None:
    found = host_certs((tmp_path,), _lay_out(tmp_path, names).name)
    assert problem in found.problem
    contexts = HostContexts(None, (), (tmp_path,))
    with pytest.raises(RegistryCertsInvalid) as raised:
        contexts.for_host(HOST)
    assert raised.value.reason == "RegistryCertsInvalid" and problem in raised.value.message


def test_too_many_files_and_too_large_a_file_are_reasons(tmp_path: Path) -> None:
    many = [f"{n:03}.crt" for n in range(MAX_HOST_FILES + 1)]
    assert (
        "more than the 64"
        in host_certs((tmp_path / "a",), _lay_out(tmp_path / "a", many).name).problem
    )
    _lay_out(tmp_path / "b", ["big.crt"], "x" * (MAX_CERTS_FILE_BYTES + 1))
    with pytest.raises(RegistryCertsInvalid, match=r"big\.crt is 1048577 bytes"):
        HostContexts(None, (), (tmp_path / "b",)).for_host(HOST)


@pytest.mark.parametrize(("name", "text"), [("ca.crt", "not PEM"), ("ca.crt", "\xff")])
def test_a_ca_file_that_is_not_pem_is_a_reason(tmp_path: Path, name: str, text: str) -> None:
    _lay_out(tmp_path, [name], text)
    with pytest.raises(RegistryCertsInvalid, match=r"ca\.crt cannot be used"):
        HostContexts(None, (), (tmp_path,)).for_host(HOST)


@pytest.mark.parametrize("host", ["", ".", "..", "../etc", "a/b", "a\\b", "a\0b"])
def test_a_host_that_is_not_a_directory_name_has_none(tmp_path: Path, host: str) -> None:
    (tmp_path / "certs.d").mkdir()
    (tmp_path / "x.crt").write_text("x")  # what ".." would reach
    assert host_certs((tmp_path / "certs.d",), host) == HostCerts()
