"""The RPM's Requires for the flavour built ``--without bundled_deps``, generated from
pyproject.toml's ``[project].dependencies`` (decision 0076).

    python tools/rpm_requires.py           # print the block
    python tools/rpm_requires.py --write   # put it into packaging/nodeagent.spec

Each dependency becomes ``python%{python3_pkgversion}dist(NAME)``, the name normalized as
PEP 503 says (what Fedora's and RHEL 10's python packages provide), with its lower bound,
and its upper bound as an RPM rich dependency where pyproject has one. A unit test keeps
the spec's block equal to this output (tests/unit/test_packaging_requires.py).
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "packaging" / "nodeagent.spec"
BEGIN = "# Requires of the distribution flavour: tools/rpm_requires.py --write (do not edit)\n"
END = "# end of the generated Requires\n"
DEPENDENCY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*((?:[<>=!~]=?\s*[\w.*]+\s*,?\s*)*)$")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement(dependency: str) -> str:
    """One ``Requires:`` line for a pyproject dependency such as ``h2>=4.1,<5``."""
    found = DEPENDENCY.match(dependency.strip())
    if found is None:
        raise ValueError(f"not a plain dependency: {dependency!r}")
    dist = f"python%{{python3_pkgversion}}dist({normalized(found.group(1))})"
    bounds = dict(
        re.findall(r"(>=|<)\s*([\w.]+)", found.group(2)),
    )
    if ">=" not in bounds:
        raise ValueError(f"{dependency!r}: every dependency needs a lower bound")
    if "<" in bounds:
        return f"Requires:       ({dist} >= {bounds['>=']} with {dist} < {bounds['<']})"
    return f"Requires:       {dist} >= {bounds['>=']}"


def block(pyproject: Path = ROOT / "pyproject.toml") -> str:
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return BEGIN + "".join(requirement(d) + "\n" for d in dependencies) + END


def spec_block(spec_text: str) -> str:
    start, end = spec_text.index(BEGIN), spec_text.index(END)
    return spec_text[start : end + len(END)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help="update packaging/nodeagent.spec")
    args = parser.parse_args(argv)
    rendered = block()
    if not args.write:
        sys.stdout.write(rendered)
        return 0
    text = SPEC.read_text()
    SPEC.write_text(text.replace(spec_block(text), rendered))
    return 0


if __name__ == "__main__":
    sys.exit(main())
