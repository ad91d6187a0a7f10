"""The drill's tests each get a CRI-O of their own (they pin, reload and restart it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.testenv.crio import Crio


@pytest.fixture
async def cri(fresh_crio: Crio) -> AsyncIterator[CriClient]:
    async with CriClient(fresh_crio.endpoint, timeout_s=60) as client:
        yield client
