"""The facts the documents state match the code they describe (issue 28 item 8).

Each row names a file of the repository (docs, units, deploy), a pattern whose group is the
stated fact (a listening address, a port, a format version, a bound), and the value the
code holds (a configuration default, a constant). Every match in the file must equal the
code's value, and at least one must be found: a document reworded so that the pattern no
longer finds its fact fails here too, until the row is moved with it. Adding a row is how a
new stated fact is kept true (decision 0073).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.bundles import manifest as bundle_manifest
from nodeagent.config.mirror import MirrorSettings
from nodeagent.config.monitoring import MetricsSettings
from nodeagent.config.site import SiteSettings
from nodeagent.metrics.series import MAX_REASON_LABELS
from nodeagent.site.fetcher import MAX_DIGESTS
from nodeagent.site.standing import MAX_PEERS

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Fact:
    file: str
    pattern: str
    value: str
    what: str


def _port(address: str) -> str:
    return address.rpartition(":")[2]


def _versions() -> str:
    """'1, 2 and 3': the bundle format versions the node reads."""
    known = [str(v) for v in sorted(set(bundle_manifest.FORMAT_VERSIONS))]
    return f"{', '.join(known[:-1])} and {known[-1]}"


SITE, MIRROR, METRICS = SiteSettings().listen, MirrorSettings().listen, MetricsSettings().listen
WRITTEN = str(bundle_manifest.FRESHNESS_FORMAT_VERSION)  # create always writes channel+sequence

FACTS = [
    # Listening addresses: the peer server on the site's network, the rest on loopback.
    Fact("docs/site.md", r"`\[site\] listen`, default `([0-9.:]+)`", SITE, "peer listen"),
    Fact("docs/site.md", r"TCP `\[site\] listen` \((\d+)\)", _port(SITE), "firewall table"),
    Fact("docs/security.md", r"`\[site\] listen`, default ([0-9.:]+)\)", SITE, "peer listen"),
    Fact("docs/operations.md", r"port (\d+) open between nodes", _port(SITE), "peer port"),
    Fact("docs/mirror.md", r"on loopback,\n`([0-9.:]+)`", MIRROR, "node mirror"),
    Fact("docs/security.md", r"node mirror on (127\.0\.0\.1:\d+)", MIRROR, "node mirror"),
    Fact("docs/security.md", r"port \((\d+), above 1024\)", _port(MIRROR), "mirror port"),
    Fact("docs/security.md", r"binds (127\.0\.0\.1:\d+) at boot", MIRROR, "mirror socket"),
    Fact("systemd/nodeagent-mirror.socket", r"(?m)^ListenStream=([0-9.:]+)$", MIRROR, "the unit"),
    Fact("docs/operations.md", r"\(default `([0-9.:]+)`, loopback", METRICS, "metrics"),
    Fact("deploy/monitoring/README.md", r'`listen = "([0-9.:]+)"`', METRICS, "metrics"),
    Fact("deploy/monitoring/daemonset.yaml", r"--upstream=http://([0-9.:]+)/", METRICS, "proxy"),
    # Formats.
    Fact("docs/bundle-format.md", r"\A# [^\n]*\(versions ([0-9, and]+);", _versions(), "read"),
    Fact("docs/bundle-format.md", r"\A# [^\n]*`bundle create` writes (\d+)\)", WRITTEN, "made"),
    # Counts and bounds.
    Fact("docs/site.md", r"(\d+) entries a table", str(MAX_DIGESTS), "fetcher tables"),
    Fact("docs/site.md", r"entries a table, (\d+) peers", str(MAX_PEERS), "peers kept"),
    Fact("docs/site.md", r"\((\d+) entries, \d+ peers", str(MAX_DIGESTS), "fetcher tables"),
    Fact("docs/security.md", r"\((\d+) entries, \d+ peers", str(MAX_DIGESTS), "fetcher tables"),
    Fact("docs/security.md", r"entries, (\d+) peers", str(MAX_PEERS), "peers kept"),
    Fact("docs/operations.md", r"keeps at most (\d+) reasons", str(MAX_REASON_LABELS), "labels"),
    Fact("docs/operations.md", r"a counter had (\d+) reasons", str(MAX_REASON_LABELS), "labels"),
]


@pytest.mark.parametrize("fact", FACTS, ids=[f"{f.file}:{f.what}" for f in FACTS])
def test_the_document_states_what_the_code_holds(fact: Fact) -> None:
    text = (ROOT / fact.file).read_text(encoding="utf-8")
    found = re.findall(fact.pattern, text)
    assert found, f"{fact.file} no longer states {fact.what} ({fact.pattern}): move the row"
    assert set(found) == {fact.value}, f"{fact.file}: {fact.what} is {fact.value} in the code"


def test_no_document_says_nodeagent_listens_on_loopback_only() -> None:
    """The peer server listens on the site's network (issue 28): a document may say that a
    named server binds loopback, never that nodeagent as a whole does."""
    said = re.compile(r"nodeagent (?:only )?listens (?:only )?on (?:loopback|127\.0\.0\.1)", re.I)
    places = [*ROOT.glob("docs/*.md"), *ROOT.glob("systemd/*.*"), ROOT / "README.md"]
    wrong = [str(p.relative_to(ROOT)) for p in places if said.search(p.read_text("utf-8"))]
    assert wrong == []
