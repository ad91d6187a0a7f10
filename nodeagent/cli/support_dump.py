"""placeholder"""

from __future__ import annotations

import argparse
from typing import TypeAlias

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_parser(sub: Subparsers) -> None:
    return None
