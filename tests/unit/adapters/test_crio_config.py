"""Where CRI-O's pulls stage blobs, from its configuration files."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.adapters.crio_config import CrioDropins, staging_dir_of
from nodeagent.pins import ConfigFile


def files(*texts: str) -> list[ConfigFile]:
    return [
        ConfigFile(f"/etc/crio/{i}.conf", text, is_after_ours=False) for i, text in enumerate(texts)
    ]


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        ((), None),
        (("[crio.image]\npause_image = 'x'\n",), None),
        (("[crio.image]\nbig_files_temporary_dir = '/a'\n",), "/a"),
        (
            (
                "[crio.image]\nbig_files_temporary_dir = '/a'\n",
                "[crio.image]\nbig_files_temporary_dir = '/b'\n",
            ),
            "/b",
        ),
        (("[crio.image]\nbig_files_temporary_dir = '/a'\n", "not toml ["), "/a"),
        (
            (
                "[crio.image]\nbig_files_temporary_dir = '/a'\n",
                "[crio.image]\nbig_files_temporary_dir = ''\n",
            ),
            "/a",
        ),
        (("crio = 1\n",), None),
        (("[crio]\nimage = 2\n",), None),
        # Paths the kernel cannot take (a NUL raised ValueError out of the stall watch):
        (("[crio.image]\nbig_files_temporary_dir = '/a'\n", "big_files_temporary_dir = 1"), "/a"),
        (('[crio.image]\nbig_files_temporary_dir = "/x\\u0000y"\n',), None),
        (("[crio.image]\nbig_files_temporary_dir = 'relative'\n",), None),
        ((f"[crio.image]\nbig_files_temporary_dir = '/{'d' * 5000}'\n",), None),
        (("[crio.image]\nbig_files_temporary_dir = " + "[" * 100 + "]" * 100 + "\n",), None),
    ],
)
def test_the_last_file_setting_the_staging_dir_wins(
    texts: tuple[str, ...], expected: str | None
) -> None:
    assert staging_dir_of(files(*texts)) == expected


def test_staging_dirs_default_to_var_tmp(tmp_path: Path) -> None:
    main = tmp_path / "crio.conf"
    main.write_text("[crio.image]\n")
    dropins = CrioDropins(main, tmp_path / "crio.conf.d", tmp_path / "run", "99-x.conf")
    assert dropins.staging_dirs() == [Path("/var/tmp")]
    (tmp_path / "crio.conf.d").mkdir()
    (tmp_path / "crio.conf.d" / "10-tmp.conf").write_text(
        "[crio.image]\nbig_files_temporary_dir = '/var/lib/containers/tmp'\n"
    )
    assert dropins.staging_dirs() == [Path("/var/lib/containers/tmp")]
