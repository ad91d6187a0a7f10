"""``with`` for the test environment's services: ``start()`` on entry, ``stop()`` on exit."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Service:
    """A process or server the tests start and stop; subclasses define both."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
