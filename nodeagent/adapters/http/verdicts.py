"""What a served blob was found to be when asked for as a manifest, remembered (bounded).

``manifests/<digest>`` makes the server read a listed blob of at most 4 MiB, hash it and
parse it to learn whether it is a manifest. Without a memory, every such request for a
blob that is not one (a layer, a config) was read, hashed and parsed again: a certificate
holder (or a local process on the loopback mirror) could keep the shared worker threads
busy at 4 MiB a request (issue 24, finding 5). ``ManifestVerdicts`` keeps the verdict per
digest with the ``FileStamp`` of the file it was read from (device, inode, size, mtime,
ctime): a file replaced or rewritten since is read again, any other request answered from
memory. A manifest's body is kept to be sent again; a blob that is not one keeps only its
verdict (a few hundred bytes).

Bounded by ``max_entries`` and by ``max_body_bytes`` of bodies held; the least recently
used verdicts go first. An evicted verdict costs one more read and hash when asked again,
never a wrong answer. Used by ``nodeagent.adapters.http.content`` for both servers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set
from dataclasses import dataclass
from typing import Final

from nodeagent.adapters.bundles.tree import FileStamp

MAX_VERDICTS: Final = 8192
"""Verdicts kept (about 200 bytes each without a body): a release bundle lists ~1,000 blobs."""
MAX_BODY_BYTES: Final = 32 << 20
"""Manifest bodies kept, in all (real ones are 1-10 KiB; 8,192 of 4 KiB fit)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the blob read with ``stamp`` is: a manifest (``body`` and ``media_type``) or not."""

    stamp: FileStamp
    body: bytes | None = None
    media_type: str | None = None

    @property
    def size_held(self) -> int:
        return len(self.body) if self.body is not None else 0


class ManifestVerdicts:
    """Digest → ``Verdict``, least recently used first out (see the module docstring)."""

    def __init__(self, *, max_entries: int = MAX_VERDICTS, max_body_bytes: int = MAX_BODY_BYTES):
        self.max_entries, self.max_body_bytes = max_entries, max_body_bytes
        self._verdicts: OrderedDict[str, Verdict] = OrderedDict()
        self.body_bytes = 0
        """Bytes of manifest bodies held now."""

    def __len__(self) -> int:
        return len(self._verdicts)

    def get(self, digest: str, stamp: FileStamp) -> Verdict | None:
        """The verdict of ``digest`` when it was read from the file as it is now (``stamp``)."""
        verdict = self._verdicts.get(digest)
        if verdict is None or verdict.stamp != stamp:
            return None
        self._verdicts.move_to_end(digest)
        return verdict

    def put(self, digest: str, verdict: Verdict) -> None:
        """Remember ``verdict``; a body larger than the whole budget is not kept (only the
        verdict that it is a manifest is not either: it is read again when asked)."""
        self._drop(digest)
        if verdict.size_held > self.max_body_bytes:
            return
        self._verdicts[digest] = verdict
        self.body_bytes += verdict.size_held
        while len(self._verdicts) > self.max_entries or self.body_bytes > self.max_body_bytes:
            self._drop(next(iter(self._verdicts)))

    def keep_only(self, digests: Set[str]) -> None:
        """Forget the verdicts of digests not in ``digests`` (no longer served)."""
        for digest in [d for d in self._verdicts if d not in digests]:
            self._drop(digest)

    def _drop(self, digest: str) -> None:
        verdict = self._verdicts.pop(digest, None)
        if verdict is not None:
            self.body_bytes -= verdict.size_held
