"""``nodeagent unpin``'s refusals that need no daemon (decision 0072): a set the cluster's
API gives (``SetFromApi``: the next sync would pin it again), a local file that holds other
sets (``SetFileShared``: never rewritten), an unknown set (``SetNotFound``); each one
``error:`` line with what to do, and the file left in place. The unpinning itself is
tested with the real daemon and CRI-O in tests/integration/lifecycle/."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from nodeagent.cli import main as cli
from tests.testenv.agent import pinned_image_set_yaml

REF = "registry.example/app@sha256:" + "a" * 64


@pytest.fixture(autouse=True)
def default_logging() -> object:
    yield
    structlog.reset_defaults()


def unpin(root: Path, name: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(["unpin", name, "--root", str(root)])
    err = capsys.readouterr().err
    [line] = [x for x in err.splitlines() if x.startswith("error: ")]
    assert "; what to do: " in line
    return code, line


def test_a_set_from_the_api_a_shared_file_and_an_unknown_set_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    etc = tmp_path / "etc/nodeagent"
    (etc / "pinnedimagesets.d").mkdir(parents=True)
    (etc / "config.toml").write_text(
        '[cluster]\nenabled = true\nkubeconfig = "/var/lib/kubelet/kubeconfig"\n'
    )
    api_dir = tmp_path / "var/lib/nodeagent/cluster/pinnedimagesets.d"
    api_dir.mkdir(parents=True)
    (api_dir / "from-api.yaml").write_text(pinned_image_set_yaml("from-api", [REF]))
    shared = etc / "pinnedimagesets.d/two.yaml"
    shared.write_text(
        pinned_image_set_yaml("one", [REF]) + "---\n" + pinned_image_set_yaml("other", [REF])
    )

    code, line = unpin(tmp_path, "from-api", capsys)
    assert code == 65 and line.startswith("error: SetFromApi: PinnedImageSet from-api ")
    assert "oc delete pinnedimageset" in line and (api_dir / "from-api.yaml").is_file()
    code, line = unpin(tmp_path, "one", capsys)
    assert code == 65 and line.startswith("error: SetFileShared: ") and "other" in line
    assert shared.is_file()
    code, line = unpin(tmp_path, "nowhere", capsys)
    assert code == 66 and line.startswith("error: SetNotFound: ")
    code, line = unpin(tmp_path, "nodeagent-self", capsys)  # decision 0074: never unpinned
    assert code == 65 and line.startswith("error: LifecycleRefused: PinnedImageSet nodeagent-self")
