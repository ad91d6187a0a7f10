"""What the package does on the host agrees with what the daemon does there: the unit may
write every directory the configuration's defaults make the daemon write (and nothing
else), an erase removes every drop-in the daemon wrote and keeps its state, and every
document the journal catalog, the units and the man page point at is installed."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from nodeagent.adapters.bundles.registries_d import DROPIN_NAME as REGISTRIES_D_DROPIN
from nodeagent.config import NODE_MIRROR_DROPIN_NAME, Config

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "packaging" / "nodeagent.spec"
UNIT = ROOT / "systemd" / "nodeagent.service"
RPM_DIRS = {"%{_sysconfdir}": "/etc", "%{_localstatedir}": "/var"}


def unit_values(key: str) -> list[str]:
    """Every value of ``key=`` in the daemon's unit, space-separated lists split."""
    values: list[str] = []
    for line in UNIT.read_text().splitlines():
        if line.startswith(f"{key}="):
            values += line.split("=", 1)[1].split()
    return values


def canonical(path: PurePosixPath) -> PurePosixPath:
    """/var/run is a link to /run on every systemd host."""
    text = str(path)
    return PurePosixPath("/run" + text[len("/var/run") :] if text.startswith("/var/run/") else text)


def written_by_the_daemon(config: Config) -> set[PurePosixPath]:
    """The directories the daemon creates, replaces or removes files in, at their defaults."""
    runtime = config.runtime
    socket = PurePosixPath(runtime.endpoint.removeprefix("unix://"))
    paths = {
        runtime.config_dir,  # the link to the pin file
        runtime.transient_dropin_dir,  # the pin file
        runtime.registries_dir,  # the bundle mirror's and the node mirror's drop-ins
        runtime.registries_d_dir,  # the sigstore attachments drop-in of an import
        *config.specs.dirs,  # PinnedImageSets a bundle carries
        config.state.dir,
        config.state.run_dir,
        config.bundles.media_dir,  # mount points
        config.mirror.auth_file.parent,  # the node mirror's credential
    }
    return {canonical(PurePosixPath(p)) for p in paths} | {canonical(socket.parent)}


def writable(unit: str) -> list[PurePosixPath]:
    """ReadWritePaths= (a leading "-" only says a missing one is no error), StateDirectory=
    and RuntimeDirectory= (relative to /var/lib and /run)."""
    paths = [PurePosixPath(v.removeprefix("-")) for v in unit_values("ReadWritePaths")]
    paths += [PurePosixPath("/var/lib") / v for v in unit_values("StateDirectory")]
    paths += [PurePosixPath("/run") / v for v in unit_values("RuntimeDirectory")]
    return paths


def test_the_unit_may_write_exactly_what_the_daemon_writes() -> None:
    written = written_by_the_daemon(Config.default())
    allowed = writable(UNIT.read_text())
    for path in sorted(written):
        assert any(path.is_relative_to(a) for a in allowed), f"{path}: not in ReadWritePaths="
    for entry in allowed:
        assert any(p.is_relative_to(entry) for p in written), f"{entry}: written by nothing"
    assert PurePosixPath("/etc/containers/registries.d") in allowed


def scriptlet(spec: str, name: str) -> str:
    """The body of ``%name`` up to the next section."""
    found = re.search(rf"^%{name}\n(.*?)^%(?:pre|post|preun|postun|files)\b", spec, re.S | re.M)
    assert found is not None, name
    return found.group(1)


def expanded(text: str) -> str:
    for macro, value in RPM_DIRS.items():
        text = text.replace(macro, value)
    return text


def test_erase_removes_every_dropin_the_daemon_writes_and_reloads_crio() -> None:
    runtime, bundles = Config.default().runtime, Config.default().bundles
    dropins = {
        runtime.persistent_dropin_path,
        runtime.transient_dropin_path,
        runtime.registries_dir / bundles.mirror_dropin_name,
        runtime.registries_dir / NODE_MIRROR_DROPIN_NAME,
        runtime.registries_d_dir / REGISTRIES_D_DROPIN,
    }
    preun = expanded(scriptlet(SPEC.read_text(), "preun"))
    on_erase = preun.split("if [ $1 -eq 0 ]; then\n    # Erase", 1)
    assert len(on_erase) == 2, "the removal is guarded by $1 -eq 0 (erase, not upgrade)"
    removed = set(re.findall(r"^\s*rm -f (\S+)$", on_erase[1], re.M))
    assert removed == {str(p) for p in dropins}
    assert "systemctl reload crio.service" in on_erase[1]


def test_no_scriptlet_removes_the_state_directory() -> None:
    """The store and the anti-rollback marks outlive the package (a reinstall keeps them)."""
    spec = expanded(SPEC.read_text())
    for name in ("pre", "post", "preun", "postun"):
        body = scriptlet(spec, name)
        assert not re.search(r"rm -[a-z]*r[a-z]* .*?/var/lib/nodeagent", body), name


def doc_entries(spec: str) -> list[str]:
    return [e for line in re.findall(r"^%doc (.+)$", spec, re.M) for e in line.split()]


def cited_documents() -> set[str]:
    """docs/... and file:///usr/share/doc/nodeagent/... in what a node shows a technician."""
    shown = [*(ROOT / "systemd").glob("nodeagent*"), ROOT / "systemd" / "nodeagent.catalog"]
    shown += [ROOT / "docs" / "nodeagent.8", ROOT / "packaging" / "config.toml"]
    cited: set[str] = set()
    for path in shown:
        text = path.read_text()
        cited |= set(re.findall(r"\bdocs/([A-Za-z0-9_./-]*[A-Za-z0-9])", text))
        cited |= set(re.findall(r"/usr/share/doc/nodeagent/([A-Za-z0-9_./-]*[A-Za-z0-9])", text))
    return cited


def test_every_document_the_node_points_at_is_installed() -> None:
    installed = [e.removeprefix("docs/") for e in doc_entries(SPEC.read_text())]
    cited = cited_documents()
    assert "site.md" in cited and "operations.md" in cited
    for name in sorted(cited):
        covered = any(name == e or name.startswith(f"{e}/") for e in installed)
        assert covered, f"docs/{name} is cited on the node but not in %doc"
        assert list((ROOT / "docs").glob(f"{name}*")), f"docs/{name} does not exist"
