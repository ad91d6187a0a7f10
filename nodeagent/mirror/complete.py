"""Whether the node mirror may answer an image manifest: only when it can serve every blob
the manifest names (decision 0061).

containers-image picks a pull's source by its manifest and then asks that one source for
every blob, with no fallback (docs/runtime-facts.md). A store that holds an image's
manifest but not yet all its layers (a bundle the site fetcher is still fetching, blob by
blob) would fail such a pull; answering the manifest 404 instead sends the client on to the
next source, and a later pull is served whole. An index is answered as it is: which of its
platforms a client takes is not known here (a bundle may hold only some).

Pure; the manifest body is one the server already verified against its digest.
"""

from __future__ import annotations

from collections.abc import Container

from nodeagent.errors import ImageNotFound
from nodeagent.registries.manifests import read_manifest


def image_parts(body: bytes, media_type: str) -> tuple[str, ...]:
    """The digests an image manifest names (config, then layers); none for an index or a
    body this parser does not take (served as before: the digest already matched)."""
    try:
        manifest = read_manifest(body, media_type, ref="node mirror")
    except ImageNotFound:
        return ()
    if manifest.is_index or manifest.config is None:
        return ()
    return (manifest.config.digest, *(layer.digest for layer in manifest.layers))


def absent_parts(parts: tuple[str, ...], held: Container[str]) -> tuple[str, ...]:
    """Those of ``parts`` not in ``held`` (empty: the image can be served whole)."""
    return tuple(digest for digest in parts if digest not in held)
