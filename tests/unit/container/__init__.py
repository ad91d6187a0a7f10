"""Tests of the container variant: systemd/container/, tools/build_image.py, deploy/."""

from __future__ import annotations

from pathlib import Path

from tests.testenv.agent_image import load_tool

ROOT = Path(__file__).resolve().parents[3]


build_image = load_tool("build_image")
