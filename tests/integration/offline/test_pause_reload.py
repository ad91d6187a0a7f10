"""CRI-O's pause image changed by a reload: CRI-O pins it at once and the drill agrees, and
a pause image the runtime does not hold is ``PauseImageMissing`` (docs/runtime-facts.md:
CRI-O adds its ``pause_image`` to the pinned patterns itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.offline import findings as f
from tests.conftest import Pushed
from tests.integration.offline.test_runtime_facts import check, found, node_config, pin
from tests.testenv.crio import Crio

pytestmark = pytest.mark.integration


async def test_pause_image_changed_by_a_reload(
    tmp_path: Path, fresh_crio: Crio, cri: CriClient, pushed: Pushed
) -> None:
    a, b = pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)
    config = node_config(tmp_path, fresh_crio)
    await cri.pull_image(b, timeout_s=120)
    pin(fresh_crio, [], pause=a)  # not pulled
    assert (f.PAUSE_IMAGE_MISSING, a) in found(await check(config, cri))
    pin(fresh_crio, [], pause=b)  # pulled, pinned by CRI-O as its pause image
    reasons = {reason for reason, _ in found(await check(config, cri))}
    assert not reasons & {f.PAUSE_IMAGE_MISSING, f.PAUSE_IMAGE_NOT_PINNED, f.PAUSE_IMAGE_UNKNOWN}
    status = await cri.image_status(b)
    assert status is not None and status.is_pinned
