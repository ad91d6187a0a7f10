"""The node mirror's registries.conf drop-in, kept in step with the store (decision 0058).

Wiring only: ``node_mirror_dropin`` builds the adapter from ``[mirror]`` and ``[runtime]``;
``sync_dropin`` renders, writes (only changed bytes) and reloads the runtime once per change
(``[mirror] enabled = false``: removes the file, reloads once); ``dropin_loop`` (the daemon's
optional task) does it at start and whenever the store's holdings or a registries.conf file
change (inotify on the store's ``index.json``, its bundles' files and the registries.conf
directories; while the daemon is stopped, nodeagent-mirror-dropin.path runs ``nodeagent
render-mirror-dropin --write --reload`` instead). A reload that failed is owed and tried
again until delivered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

import structlog

from nodeagent.adapters.inotify import DirectoryWatcher
from nodeagent.bundles.node_mirror import dropin_condition
from nodeagent.config import NODE_MIRROR_DROPIN_NAME, Config
from nodeagent.errors import NodeAgentError
from nodeagent.status import Condition
from nodeagent.store import layout

if TYPE_CHECKING:
    from nodeagent.adapters.bundles.node_mirror_dropin import DropinOutcome, NodeMirrorDropin

log = structlog.get_logger(__name__)

RETRY_RELOAD_S: Final = 30.0
"""A runtime reload that failed is tried again after this long (or at the next change)."""


class Reloader(Protocol):
    async def reload(self) -> object: ...


ConditionSink = Callable[[Condition], None]


def node_mirror_dropin(config: Config) -> NodeMirrorDropin:
    # Loaded when there is something to render or remove (``has_work``): the renderer and
    # its adapter stay out of an idle daemon whose store holds nothing (0.7 MiB).
    from nodeagent.adapters.bundles.node_mirror_dropin import NodeMirrorDropin  # noqa: PLC0415

    runtime = config.runtime
    return NodeMirrorDropin(
        runtime.registries_dir / NODE_MIRROR_DROPIN_NAME,
        runtime.registries_conf,
        config.mirror.listen,
        own_names=(config.bundles.mirror_dropin_name,),
    )


def has_work(config: Config) -> bool:
    """Whether there is anything to write or to remove: the store has an index, or a drop-in
    of ours is there. Blocking (two stats)."""
    dropin = config.runtime.registries_dir / NODE_MIRROR_DROPIN_NAME
    return dropin.exists() or (config.store_dir / layout.INDEX_NAME).exists()


def sync_once(config: Config) -> DropinOutcome:
    """Render and write (or remove) the drop-in; blocking (files only)."""
    from nodeagent.adapters.bundles.node_mirror_dropin import (  # noqa: PLC0415
        DropinOutcome,
        held_repositories,
    )

    dropin = node_mirror_dropin(config)
    if not config.mirror.enabled:
        return DropinOutcome("removed" if dropin.remove() else "absent", dropin.path)
    return dropin.sync(held_repositories(config.store_dir))


def log_outcome(outcome: DropinOutcome) -> None:
    if outcome.action == "refused":
        log.warning(
            "mirror_dropin_not_written",
            file=str(outcome.path),
            reason=outcome.reason,
            error=outcome.message,
        )
        return
    if outcome.action in ("wrote", "removed"):
        log.info(
            "mirror_dropin_written" if outcome.action == "wrote" else "mirror_dropin_removed",
            file=str(outcome.path),
            repositories=outcome.repositories,
            skipped=outcome.skipped,
        )
    for repository in outcome.blocked:
        log.info(
            "mirror_source_blocked",
            image=repository,
            error="the source registry is blocked (NeverContactSource): the mirrors are the "
            "only way to it, there is no fallback to the source",
        )


async def sync_dropin(
    config: Config, reloader: Reloader, report: ConditionSink, *, is_owed: bool = False
) -> bool:
    """One round; returns whether a reload is still owed (it failed)."""
    if not is_owed and not await asyncio.to_thread(has_work, config):
        report(dropin_condition("absent", 0))
        return False
    try:
        outcome = await asyncio.to_thread(sync_once, config)
    except NodeAgentError as exc:
        log.warning("mirror_dropin_not_written", reason=exc.reason, error=exc.message)
        report(dropin_condition("failed", 0, reason=exc.reason, message=exc.message))
        return is_owed
    log_outcome(outcome)
    report(
        dropin_condition(
            outcome.action,
            outcome.repositories,
            outcome.blocked,
            reason=outcome.reason,
            message=outcome.message,
        )
    )
    if not (is_owed or outcome.action in ("wrote", "removed")):
        return False
    try:
        how = await reloader.reload()
    except NodeAgentError as exc:
        log.warning("mirror_dropin_reload_failed", reason=exc.reason, error=exc.message)
        return True
    log.info("mirror_dropin_applied", reload=str(how))
    return False


async def next_change(watchers: Sequence[DirectoryWatcher]) -> None:
    """Until one of ``watchers`` reports a change (the others keep theirs for later)."""
    waits = [asyncio.ensure_future(anext(w)) for w in watchers]
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for finished in done:
            finished.result()  # a watcher's failure is the loop's
    finally:
        for waiting in waits:
            waiting.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def dropin_loop(config: Config, reloader: Reloader, report: ConditionSink) -> None:
    """At start, then at every change of the store's records or of registries.conf files."""
    # The store's index.json is replaced whenever its holdings change; a bundle's files
    # (bundles/<id>/, watched to any depth) when a bundle that serves tags comes or goes,
    # which need not change index.json (the same images, now with a served tag).
    runtime = config.runtime
    watched = [config.store_dir, runtime.registries_conf.parent, runtime.registries_dir]
    records = [config.store_dir / layout.BUNDLES_DIR]
    async with (
        DirectoryWatcher(watched, debounce_s=0.5) as watcher,
        DirectoryWatcher(records, debounce_s=0.5, recursive=True) as bundles,
    ):
        # Watching before the first render: a change made meanwhile is not missed.
        owed = await sync_dropin(config, reloader, report)
        while True:
            try:
                async with asyncio.timeout(RETRY_RELOAD_S if owed else None):
                    await next_change((watcher, bundles))
            except TimeoutError:
                pass
            owed = await sync_dropin(config, reloader, report, is_owed=owed)
