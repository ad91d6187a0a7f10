"""Regenerate nodeagent/adapters/cri/api/runtime_v1_pb2.{py,pyi} from the .proto.

Run from the repository root with the dev dependencies installed:

    python tools/gen_cri_proto.py

Only message classes are generated; the adapter builds its gRPC calls from
method paths, so no *_pb2_grpc module is needed.
"""

from __future__ import annotations

import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "nodeagent" / "adapters" / "cri" / "api"


def main() -> int:
    args = [
        "protoc",
        f"--proto_path={PKG}",
        f"--python_out={PKG}",
        f"--pyi_out={PKG}",
        str(PKG / "runtime_v1.proto"),
    ]
    return int(protoc.main(args))


if __name__ == "__main__":
    sys.exit(main())
