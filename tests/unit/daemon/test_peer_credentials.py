"""``serve-peers`` takes each TLS file from ``$CREDENTIALS_DIRECTORY`` when systemd passed it
there (``LoadCredential=``), else from ``[site]`` (decision 0056)."""

from __future__ import annotations

from pathlib import Path

from nodeagent.config.site import SiteSettings
from nodeagent.daemon.site import tls_files


def test_credentials_come_first_each_one_falling_back_to_its_setting(tmp_path: Path) -> None:
    site = SiteSettings()
    configured = (site.cert_file, site.key_file, site.ca_file)
    assert tls_files(site, {}) == configured
    assert tls_files(site, {"CREDENTIALS_DIRECTORY": str(tmp_path)}) == configured
    (tmp_path / "peer-cert").write_text("cert")
    (tmp_path / "peer-key").write_text("key")
    found = tls_files(site, {"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert found == (tmp_path / "peer-cert", tmp_path / "peer-key", site.ca_file)
