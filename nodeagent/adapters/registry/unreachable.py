"""Hosts that could not be reached lately: asked again only after a while.

A sync sizes many images; when their registry (or a mirror of it) does not answer, each
look-up would wait out its own connect timeout. ``UnreachableHosts`` remembers the first
failure per host (``netloc``, with its scheme) for ``memory_s`` and turns later look-ups
into an immediate ``RegistryUnavailable`` that carries the first failure's reason.
"""

from __future__ import annotations

from collections.abc import Callable

from nodeagent.errors import RegistryUnavailable
from nodeagent.strict import clip


class UnreachableHosts:
    """``check`` before asking a host, ``note`` when it could not be reached."""

    def __init__(self, memory_s: float, clock: Callable[[], float]) -> None:
        self.memory_s = memory_s
        self._clock = clock
        self._hosts: dict[str, tuple[str, float]] = {}
        """Host → (why it could not be reached, monotonic time of that attempt)."""

    def note(self, host: str, scheme: str, reason: str) -> None:
        self._hosts[f"{scheme}://{host}"] = (reason, self._clock())

    def check(self, ref: str, host: str, scheme: str) -> None:
        """Raise ``RegistryUnavailable`` when ``host`` could not be reached lately."""
        key = f"{scheme}://{host}"
        known = self._hosts.get(key)
        if known is None:
            return
        reason, tried_s = known
        age_s = self._clock() - tried_s
        if not 0 <= age_s < self.memory_s:
            del self._hosts[key]
            return
        raise RegistryUnavailable(
            f"{clip(ref)}: {host} could not be reached {age_s:.0f} s ago ({reason}); "
            f"not asked again for another {self.memory_s - age_s:.0f} s"
        )

    def forget(self) -> None:
        """Ask every host again (a new sync, or the network came back)."""
        self._hosts.clear()
