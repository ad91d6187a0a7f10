"""A mirror drop-in left by a killed import or restore is removed when the daemon starts."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from nodeagent.config import load_config
from nodeagent.daemon.root import remove_stale_mirror


def test_a_left_mirror_is_removed_and_reported_and_none_is_no_event(tmp_path: Path) -> None:
    config = load_config(Path("/etc/nodeagent/config.toml"), root=tmp_path)
    path = config.runtime.registries_dir / config.bundles.mirror_dropin_name
    assert str(path).startswith(str(tmp_path))
    path.parent.mkdir(parents=True)
    path.write_text('[[registry]]\nprefix = "quay.io/acme"\n')
    other = path.parent / "01-site.conf"
    other.write_text("# the site's own\n")
    with capture_logs() as logs:
        remove_stale_mirror(config)
        remove_stale_mirror(config)  # nothing left: nothing said
    assert not path.exists() and other.exists()
    assert [e["event"] for e in logs] == ["stale_mirror_removed"]
