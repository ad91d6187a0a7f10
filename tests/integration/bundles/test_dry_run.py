"""``bundle create --dry-run`` against the session registry: the plan it prints is the bundle
``bundle create`` then writes (blob count and every byte of every file), nothing is written,
and a target too small says so (exit 73, one ``error:`` line) on a tmpfs of its own."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.bundles import minisign
from nodeagent.cli.main import main
from tests.conftest import Pushed
from tests.testenv.registry import Registry
from tests.unit.cli import schemas

pytestmark = pytest.mark.integration


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def create_args(pushed: Pushed, registry: Registry, output: Path) -> list[str]:
    return [
        "bundle", "create", "--image", pushed.ref(pushed.base_a), pushed.ref(pushed.base_b),
        "--output", str(output), "--id", "dry-run", "--arch", "amd64", "--sequence", "7",
        "--insecure-registry", registry.host, "--config", "/nonexistent/nodeagent.toml",
    ]  # fmt: skip


def files_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


async def test_the_plan_is_the_bundle_create_writes(
    tmp_path: Path, registry: Registry, pushed: Pushed, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "medium" / "bundle"
    code, text, err = await run(
        capsys, *create_args(pushed, registry, output), "--dry-run", "--json"
    )
    assert code == 0, err
    plan = schemas.check("bundle-create-dry-run", text)
    assert not output.exists() and not output.parent.exists()  # nothing written
    assert plan["target"]["measuredAt"] == str(tmp_path) and plan["target"]["fits"]
    assert [i["image"] for i in plan["images"]] == [
        pushed.ref(pushed.base_a),
        pushed.ref(pushed.base_b),
    ]

    code, text, err = await run(capsys, *create_args(pushed, registry, output), "--dry-run")
    assert code == 0, err
    assert text.startswith("dry run: bundle dry-run would hold 2 images, ")
    assert "nothing was written" in text and "; fits (" in text

    _public, secret = minisign.generate_keypair(comment="dry run")
    key = tmp_path / "factory.key"
    key.write_text(secret)
    code, text, err = await run(
        capsys, *create_args(pushed, registry, output), "--key", str(key), "--json"
    )
    assert code == 0, err
    created = json.loads(text)
    assert created["blobs"] == plan["blobs"]  # base layer shared: counted once in both
    assert files_bytes(output) == plan["sizeBytes"]  # every file, bundle.json and its signature
    assert plan["target"]["neededBytes"] >= plan["sizeBytes"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 128 KiB tmpfs: smaller than the two images' 256 KiB shared layer."""
    mountpoint = tmp_path / "stick"
    mountpoint.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=128k,mode=0700", "tmpfs", str(mountpoint)], check=True
    )
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=False)


@pytest.mark.needs("root")  # mount(2) of a tmpfs
async def test_a_target_too_small_is_said_before_a_byte(
    small_disk: Path, registry: Registry, pushed: Pushed, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text, err = await run(capsys, *create_args(pushed, registry, small_disk), "--dry-run")
    assert code == 73
    assert "DOES NOT FIT" in text
    [line] = err.splitlines()
    assert line.startswith("error: InsufficientDiskSpace: ") and "what to do: " in line
    assert await asyncio.to_thread(os.listdir, small_disk) == []
    code, text, _err = await run(
        capsys, *create_args(pushed, registry, small_disk), "--dry-run", "--json"
    )
    doc = schemas.check("bundle-create-dry-run", text)
    assert code == 73 and doc["target"]["fits"] is False
    assert doc["target"]["availableBytes"] < doc["target"]["neededBytes"]
