"""Whether the node mirror may answer a manifest: only when it can serve the image whole
(decision 0061).

containers-image picks a pull's source by its manifest and then asks that one source for
every blob, with no fallback (docs/runtime-facts.md). A store that holds an image's
manifest but not yet all its layers (a bundle the site fetcher is still fetching, blob by
blob) would fail such a pull; answering the manifest 404 instead sends the client on to the
next source, and a later pull is served whole. So:

* an image manifest needs its config and every layer;
* an index needs its entry for this node's platform (the one CRI-O on this node takes,
  ``registries.select_platform``), itself whole; an index without such an entry is
  answered as it is (which platform a client takes is not known then; a bundle may hold
  only some).

Pure; the manifest body is one the server already verified against its digest.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.errors import ImageNotFound
from nodeagent.registries.manifests import ManifestIndex, Platform, read_manifest, select_platform

_REF = "node mirror"


@dataclass(frozen=True, slots=True)
class Parts:
    """What must be servable for a manifest to be answered."""

    blobs: tuple[str, ...] = ()
    """An image manifest's config, then its layers."""
    child: str = ""
    """An index's entry for this node's platform ("" when none, or not an index)."""


def manifest_parts(body: bytes, media_type: str, platform: Platform) -> Parts:
    """What a manifest needs; nothing for a body this parser does not take (served as
    before: its digest already matched)."""
    try:
        manifest = read_manifest(body, media_type, ref=_REF)
    except ImageNotFound:
        return Parts()
    if manifest.is_index:
        entries = tuple((d.digest, d.platform or Platform("", "")) for d in manifest.manifests)
        try:
            return Parts(child=select_platform(ManifestIndex(entries), platform, ref=_REF))
        except ImageNotFound:
            return Parts()
    if manifest.config is None:
        return Parts()
    return Parts(blobs=(manifest.config.digest, *(layer.digest for layer in manifest.layers)))
