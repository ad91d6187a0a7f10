"""The registry client's values: where one request goes (``Target``), a cached bearer
token, what ``fetch_to`` wrote, and an answer's status turned into an error."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nodeagent.adapters.registry.transport import Response
from nodeagent.ports import RegistryCredentials
from nodeagent.registries import status_error


@dataclass(frozen=True, slots=True)
class Target:
    """One image's repository and how to talk to its registry."""

    ref: str
    host: str
    repository: str
    digest: str
    base_url: str
    credentials: RegistryCredentials | None

    @property
    def scope(self) -> str:
        return f"repository:{self.repository}:pull"


@dataclass(slots=True)
class Token:
    value: str = field(repr=False)  # a secret: never in a repr or a log
    expires_at_s: float


@dataclass(frozen=True, slots=True)
class Fetched:
    """What ``fetch_to`` wrote: verified content ``digest`` of ``size_bytes``."""

    digest: str
    size_bytes: int
    media_type: str
    """The ``Content-Type`` the registry sent (a manifest's media type); may be empty."""


def raise_for_status(response: Response, ref: str, what: str) -> None:
    now_s = time.time()  # Retry-After may be a date
    error = status_error(response.status, response.headers, ref=ref, what=what, now_s=now_s)
    if error is not None:
        raise error
