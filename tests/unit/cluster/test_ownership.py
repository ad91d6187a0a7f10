"""Who pins the API's sets: ``[cluster] api_sets`` and the machine-config-daemon's annotation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.cluster.ownership import MCD_ANNOTATION, api_sets_owner, is_mcd_managed
from nodeagent.config import load_config
from nodeagent.errors import ConfigInvalid

MANAGED = {"metadata": {"name": "n", "annotations": {MCD_ANNOTATION: "rendered-worker-1"}}}
PLAIN = {"metadata": {"name": "n", "annotations": {"other": "x"}}}
EMPTY_VALUE = {"metadata": {"name": "n", "annotations": {MCD_ANNOTATION: ""}}}


@pytest.mark.parametrize(
    ("mode", "node", "has_pools", "owner"),
    [
        ("auto", MANAGED, True, "mcd"),
        ("auto", PLAIN, True, "nodeagent"),
        ("auto", EMPTY_VALUE, True, "nodeagent"),
        ("auto", MANAGED, False, "nodeagent"),  # no pools: no machine-config-daemon pinning
        ("auto", None, True, "nodeagent"),
        ("nodeagent", MANAGED, True, "nodeagent"),
        ("mcd", PLAIN, False, "mcd"),
    ],
)
def test_owner(mode: str, node: dict[str, Any] | None, has_pools: bool, owner: str) -> None:
    ownership = api_sets_owner(mode, node, has_pools=has_pools)
    assert ownership.owner == owner
    assert ownership.is_ours == (owner == "nodeagent")
    assert ownership.why


@pytest.mark.parametrize(
    "node",
    [{}, {"metadata": None}, {"metadata": {"annotations": ["x"]}},
     {"metadata": {"annotations": {MCD_ANNOTATION: 5}}}],
)  # fmt: skip
def test_malformed_nodes_are_not_managed(node: dict[str, Any]) -> None:
    assert not is_mcd_managed(node)


def test_config_takes_the_three_modes_only(tmp_path: Path) -> None:
    for mode in ("auto", "nodeagent", "mcd"):
        (tmp_path / "c.toml").write_text(f'[cluster]\napi_sets = "{mode}"\n')
        assert load_config(tmp_path / "c.toml").cluster.api_sets == mode
    (tmp_path / "c.toml").write_text('[cluster]\napi_sets = "both"\n')
    with pytest.raises(ConfigInvalid, match="one of auto, nodeagent, mcd, got 'both'"):
        load_config(tmp_path / "c.toml")
