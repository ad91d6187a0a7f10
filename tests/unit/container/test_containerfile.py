"""deploy/container/Containerfile, the production (UBI) build: checked statically only, as
nothing can be pulled here. It lays the image out as tools/build_image.py does."""

from __future__ import annotations

import re
from pathlib import Path

import nodeagent
from tests.unit.container import ROOT, build_image

CONTAINERFILE = ROOT / "deploy/container/Containerfile"


def instructions() -> list[tuple[str, str]]:
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    found = []
    for line in lines:
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword, rest))
    return found


def test_every_instruction_is_known_and_every_copied_source_exists() -> None:
    known = {"FROM", "USER", "COPY", "RUN", "ARG", "ENV", "LABEL", "ENTRYPOINT", "CMD"}
    for keyword, rest in instructions():
        assert keyword in known, keyword
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            for source in sources:
                assert _source(source).exists(), source


def _source(name: str) -> Path:
    """A COPY source in the build context: the repository's root; the package itself is
    the one under test (the RPM's %check runs these tests without the tree's nodeagent/)."""
    if name.rstrip("/") == "nodeagent":
        return Path(nodeagent.__file__).resolve().parent
    return ROOT / name


def test_the_same_layout_and_entrypoint_as_make_image() -> None:
    text = CONTAINERFILE.read_text()
    assert (ROOT / "deploy/container/nodeagent-launcher").read_text() == (
        build_image.LAUNCHER.replace("#!/usr/bin/python3 -I", "#!/usr/bin/python3.11 -I")
    )
    assert (ROOT / "deploy/container/host-tool").read_text() == build_image.HOST_TOOL
    for tool in build_image.HOST_TOOLS:
        assert f"/usr/bin/{tool}" in text
    assert 'ENTRYPOINT ["/usr/bin/nodeagent"]' in text and 'CMD ["run"]' in text
    assert "--require-hashes" in text  # the same locked wheels as the RPM and make image
    assert re.search(r"^FROM registry\.access\.redhat\.com/ubi9/", text, re.MULTILINE)
