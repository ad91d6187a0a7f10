"""Byte sizes as people write them ("2GiB", "500MB", "1.5G") and as nodeagent prints them.

Suffixes follow the Kubernetes quantity convention: a bare SI letter or SI
unit is decimal (``G`` = ``GB`` = 10**9), an ``i`` makes it binary (``Gi`` =
``GiB`` = 2**30). Suffixes are case-insensitive and a space may separate
number and suffix. A number without suffix (or with ``B``) is bytes.
Fractions are allowed and rounded down to whole bytes ("1.1KiB" is 1126).
"""

from __future__ import annotations

import re

__all__ = ["parse_size", "format_bytes"]

_MULTIPLIERS: dict[str, int] = {
    "": 1,
    "b": 1,
    **{letter: 1000**power for power, letter in enumerate("kmgtpe", start=1)},
    **{f"{letter}b": 1000**power for power, letter in enumerate("kmgtpe", start=1)},
    **{f"{letter}i": 1024**power for power, letter in enumerate("kmgtpe", start=1)},
    **{f"{letter}ib": 1024**power for power, letter in enumerate("kmgtpe", start=1)},
}

_SIZE_RE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<suffix>[a-zA-Z]*)")

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def parse_size(text: str) -> int:
    """Bytes in ``text``: ``"2GiB"`` → 2147483648, ``"500MB"`` → 500000000, ``"42"`` → 42.

    Raises ``ValueError`` saying what is wrong; callers wrap it into their own
    error (configuration keys become ``ConfigInvalid``).
    """
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"{text!r} is not a size; write a non-negative number with an optional unit, "
            "e.g. 2GiB, 500MB or 1073741824"
        )
    suffix = match["suffix"].lower()
    multiplier = _MULTIPLIERS.get(suffix)
    if multiplier is None:
        raise ValueError(
            f"{text!r} has an unknown unit {match['suffix']!r}; use B, K/KB/KiB, M/MB/MiB, "
            "G/GB/GiB, T/TB/TiB, P/PB/PiB or E/EB/EiB"
        )
    whole, _, fraction = str(match["number"]).partition(".")
    # Integer arithmetic, exact and rounded down, without loading the decimal module.
    scale: int = 10 ** len(fraction)
    return int(whole) * multiplier + int(fraction or "0") * multiplier // scale


def format_bytes(size_bytes: int) -> str:
    """``size_bytes`` in binary units, one decimal: 1610612736 → ``"1.5 GiB"``, 512 → ``"512 B"``.

    A whole number drops its decimal (``"2 GiB"``); negative numbers keep their sign.
    """
    if size_bytes < 0:
        return "-" + format_bytes(-size_bytes)
    if size_bytes < 1024:
        return f"{size_bytes} B"
    value = float(size_bytes)
    unit_index = 0
    while round(value, 1) >= 1024 and unit_index < len(_BINARY_UNITS) - 1:
        value /= 1024
        unit_index += 1
    return f"{value:.1f}".removesuffix(".0") + f" {_BINARY_UNITS[unit_index]}"
