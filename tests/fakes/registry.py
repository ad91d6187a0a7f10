"""Registry manifests in memory: a ``disk.ManifestSource`` for service tests.

``FakeManifests`` answers ``image_layers`` with one layer of the size a test gives per
reference, or raises the error a test scripts (one per call, the last one repeating).
Its contract with the real ``RegistryClient`` behind a failing registry (sizes, and the
error classes for a registry down, answering 5xx, or missing the image) is
tests/integration/adapters/registry/test_manifests_contract.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from nodeagent.disk import ImageLayers
from nodeagent.errors import ImageNotFound, NodeAgentError
from nodeagent.ports import RegistryCredentials


def layer_digest(ref: str) -> str:
    return "sha256:" + hashlib.sha256(ref.encode()).hexdigest()


class FakeManifests:
    """``disk.ManifestSource``: one layer of ``sizes[ref]`` bytes, or a scripted error."""

    def __init__(
        self,
        sizes: Mapping[str, int],
        errors: Mapping[str, Sequence[NodeAgentError | None]] | None = None,
    ) -> None:
        self.sizes = dict(sizes)
        self.errors = {ref: list(script) for ref, script in (errors or {}).items()}
        self.calls: list[str] = []

    def fail(self, ref: str, *script: NodeAgentError | None) -> None:
        """The next look-ups of ``ref`` raise these errors (None: answer), the last repeats."""
        self.errors[ref] = list(script)

    async def image_layers(
        self, ref: str, credentials: RegistryCredentials | None = None
    ) -> ImageLayers:
        self.calls.append(ref)
        script = self.errors.get(ref)
        if script:
            error = script.pop(0) if len(script) > 1 else script[0]
            if error is not None:
                raise error
        if ref not in self.sizes:
            raise ImageNotFound(f"{ref}: the registry has no such manifest (HTTP 404)")
        size = self.sizes[ref]
        return ImageLayers(ref, layer_digest("manifest " + ref), 1000, ((layer_digest(ref), size),))
