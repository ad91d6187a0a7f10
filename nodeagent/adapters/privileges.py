"""A process giving up what it does not need: no new privileges, no capabilities.

``nodeagent serve-session`` calls ``shed`` first (decision 0064). Under
``nodeagent-session.socket`` systemd has already done both (``NoNewPrivileges=``, an empty
``CapabilityBoundingSet=``, another user); as the daemon's own child (``[bundles]
session_socket = ""``) it is what keeps a root daemon's capabilities (mounting, reading any
file) out of the process that parses HTTP. Clearing one's own capability sets needs no
privilege; a system call filter that denies ``capset`` (the daemon's unit) leaves them,
and that is said.
"""

from __future__ import annotations

import ctypes
import os
from typing import Final

PR_SET_NO_NEW_PRIVS: Final = 38
_LINUX_CAPABILITY_VERSION_3: Final = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def shed() -> list[str]:
    """Set no_new_privs and clear this process's capability sets; what could not be done
    (each with its errno's text), empty when both were."""
    libc, failed = _libc(), []
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        failed.append(f"no_new_privs: {os.strerror(ctypes.get_errno())}")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()  # all zero: no capability effective, permitted or inheritable
    if libc.capset(ctypes.byref(header), data) != 0:
        failed.append(f"capabilities: {os.strerror(ctypes.get_errno())}")
    return failed
