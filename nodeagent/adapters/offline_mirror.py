"""The offline drill's facts about the node mirror (``offline.mirror_checks``): the images
the store holds, and the registries.conf drop-in that should mirror their repositories."""

from __future__ import annotations

from typing import Final

from nodeagent.config import Config
from nodeagent.config.mirror import NODE_MIRROR_DROPIN_NAME
from nodeagent.errors import ImageReferenceInvalid, NodeAgentError
from nodeagent.offline import findings as f
from nodeagent.offline.facts import NodeMirrorDropin
from nodeagent.offline.findings import Finding, finding
from nodeagent.references import PinnedImageRef, parse_pinned_image_ref
from nodeagent.registries.names import repository_name
from nodeagent.strict import MalformedInput, clip

MAX_DROPIN_BYTES: Final = 4 << 20


def _refs(names: list[str]) -> list[PinnedImageRef]:
    refs = []
    for name in names:
        try:
            refs.append(parse_pinned_image_ref(name))
        except ImageReferenceInvalid:
            continue
    return refs


def _incomplete(what: str, error: object) -> Finding:
    return finding(
        f.CHECK_INCOMPLETE,
        f"could not read {what}: {clip(error, 300)}",
        "fix what the message names; the checks that need it did not run",
        subject=what,
    )


def _read_dropin(config: Config, problems: list[Finding]) -> tuple[str, str | None] | None:
    path = config.runtime.registries_dir / NODE_MIRROR_DROPIN_NAME
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_DROPIN_BYTES + 1)
    except FileNotFoundError:
        return str(path), None
    except OSError as err:
        problems.append(_incomplete(str(path), err.strerror))
        return None
    if len(data) > MAX_DROPIN_BYTES:
        problems.append(_incomplete(str(path), f"more than {MAX_DROPIN_BYTES} bytes"))
        return None
    return str(path), data.decode("utf-8", "replace")


def mirror_facts(
    config: Config, problems: list[Finding], *, store_is_empty: bool
) -> tuple[frozenset[str] | None, NodeMirrorDropin | None]:
    """(manifest digests of the images the store holds, the drop-in as found) (blocking)."""
    if store_is_empty:
        return frozenset(), None
    from nodeagent.adapters.store.blobs import BlobStore  # noqa: PLC0415  (a store to read)
    from nodeagent.adapters.store.records import StoreRecords  # noqa: PLC0415

    root = config.store_dir
    try:
        stored = BlobStore(root).stored()
        records = StoreRecords(root).load(is_repairing=False).records
    except (NodeAgentError, MalformedInput, OSError) as exc:
        problems.append(_incomplete(f"the node's image store {clip(root, 200)}", exc))
        return None, None
    images = [image for r in records for image in r.images if image.digest in stored]
    digests = frozenset(image.digest for image in images)
    if not config.mirror.enabled:
        return digests, None
    found = _read_dropin(config, problems)
    if found is None:
        return digests, None
    # as bundles.mirror.mirror_repositories names them, without loading the bundles' code
    # at idle (the offline check runs in the idle daemon: 0.9 MiB, test_idle_memory)
    refs = _refs([image.name for image in images])
    repositories = frozenset(repository_name(r.host, r.repository) for r in refs)
    return digests, NodeMirrorDropin(found[0], config.mirror.listen, repositories, found[1])
