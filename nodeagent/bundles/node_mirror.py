"""The node mirror drop-in's ``MirrorDropin`` condition (pure; decision 0058).

What ``nodeagent status``, the status file and NodeImageStatus say of the drop-in: whether
it is in step with the store and the other registries.conf files, and which held
repositories have a blocked source (``NeverContactSource``), for which no pull falls back
to the source when the mirrors cannot serve it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from nodeagent.status import Condition
from nodeagent.strict import clip

CONDITION_TYPE: Final = "MirrorDropin"
MAX_NAMED: Final = 5
"""Blocked repositories named in the message; the rest are counted."""


def dropin_condition(
    action: str,
    repositories: int,
    blocked: Sequence[str] = (),
    *,
    reason: str = "",
    message: str = "",
) -> Condition:
    """The condition after a render: ``action`` is the adapter's (``wrote``, ``unchanged``,
    ``removed``, ``absent``, ``refused``) or ``failed`` (``reason``, ``message``: the error)."""
    if action in ("refused", "failed"):
        return Condition(CONDITION_TYPE, False, reason, clip(message, 500))
    if action in ("removed", "absent"):
        return Condition(CONDITION_TYPE, True, "NoDropin", "no drop-in: nothing to mirror")
    text = f"{repositories} repositories point at the node mirror first"
    if not blocked:
        return Condition(CONDITION_TYPE, True, "Current", text)
    named = ", ".join(clip(b, 200) for b in blocked[:MAX_NAMED])
    more = f" and {len(blocked) - MAX_NAMED} more" if len(blocked) > MAX_NAMED else ""
    return Condition(
        CONDITION_TYPE,
        True,
        "SourceBlocked",
        f"{text}; no fallback to the source (blocked) for {named}{more}: "
        "only their mirrors serve them",
    )
