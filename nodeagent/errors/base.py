"""The roots of the error tree (see the package's docstring) and the transient reasons."""

from __future__ import annotations

from typing import ClassVar


class NodeAgentError(Exception):
    """Base of every error nodeagent raises on purpose."""

    reason: ClassVar[str] = "Unknown"
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class TransientError(NodeAgentError):
    """The operation may succeed if tried again after ``retry_after_s`` seconds."""

    reason = "Transient"
    exit_code = 75  # EX_TEMPFAIL
    default_retry_after_s: ClassVar[float] = 1.0

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = self.default_retry_after_s if retry_after_s is None else retry_after_s


class PermanentError(NodeAgentError):
    """Trying the same operation again will fail the same way until something changes."""

    reason = "Permanent"


def transient_reasons() -> frozenset[str]:
    """The reason codes of every ``TransientError``: a failure with one of them may go away."""
    found: set[str] = set()
    pending: list[type[NodeAgentError]] = [TransientError]
    while pending:
        cls = pending.pop()
        found.add(cls.reason)
        pending.extend(cls.__subclasses__())
    return frozenset(found)


def is_transient_reason(reason: str | None) -> bool:
    """Whether ``reason`` is the code of a transient error (retry soon, not at the resync)."""
    return reason is not None and reason in transient_reasons()
