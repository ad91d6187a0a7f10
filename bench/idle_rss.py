"""Idle RSS of the daemon in the reference configuration, and what each optional feature adds.

The reference node (docs/performance.md, "Idle memory"): media watching on (as packaged),
the registry over HTTPS (verified: the daemon and CRI-O both get the registry's CA through
``SSL_CERT_FILE``), cluster mode off, site serving off, metrics off; one small set pinned.
Each variant adds one feature to it:

| variant | what it adds |
| --- | --- |
| ``reference`` | nothing (the baseline, measured in the same run) |
| ``metrics`` | ``[metrics] enabled`` on loopback, scraped once before the measurement |
| ``site`` | ``[site] serve`` with mutual TLS on loopback (certificates of a throwaway CA) |
| ``cluster`` | ``[cluster] enabled`` against the test environment's kube-apiserver |
| ``all`` | metrics, site serving and cluster mode together |

Each variant runs the daemon as a node would (the bundled wheels only, byte-compiled,
``MALLOC_ARENA_MAX=2``: ``tests/integration/pins/test_idle_memory.py``) against a fresh
CRI-O, waits for the set to be pinned, then for VmRSS to stay the same for 2 s. It prints
VmRSS per variant, the delta and ratio to the reference, and whether the reference with
metrics on stays within the 40 MiB budget (exit 1 if not)::

    .venv/bin/python -m bench.idle_rss                 # every variant, ~2 min
    .venv/bin/python -m bench.idle_rss --variant reference --variant metrics --repeat 3
    .venv/bin/python -m bench.idle_rss --json > result.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.integration.pins.test_idle_memory import runtime_python, steady_rss_kib
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import apply, install_deploy, pinned_image_set
from tests.testenv.pki import Authority
from tests.testenv.registry import Registry, free_port

BUDGET_MIB = 40.0
VARIANTS = ("reference", "metrics", "site", "cluster", "all")
SET_NAME = "idle"
NODE = "idle-rss-0"


def metrics_section(port: int) -> str:
    return f'\n[metrics]\nenabled = true\nlisten = "127.0.0.1:{port}"\n'


def site_section(base: Path) -> str:
    ca = Authority("idle-rss-ca")
    base.mkdir(parents=True, exist_ok=True)
    (base / "ca.crt").write_bytes(ca.cert_pem)
    ca.serving(NODE).write_pair(base / "server.pem", base / "server.pem")
    ca.client(NODE).write_pair(base / "client.pem", base / "client.pem")
    return f"""
[site]
serve = true
listen = "127.0.0.1:{free_port()}"
follow = "off"
cert_file = "{base / "server.pem"}"
key_file = "{base / "server.pem"}"
client_cert_file = "{base / "client.pem"}"
client_key_file = "{base / "client.pem"}"
ca_file = "{base / "ca.crt"}"
"""


def cluster_section(kube: KubeCluster) -> str:
    return f"""
[cluster]
enabled = true
kubeconfig = "{kube.kubeconfig_for_node(NODE)}"
node_name = "{NODE}"
set_selector = "bench=idle-rss"
"""


def scrape(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return len(answer.read())


def run_variant(
    variant: str,
    base: Path,
    registry: Registry,
    ref: str,
    *,
    kube: KubeCluster | None,
    python: str,
) -> float:
    """Idle VmRSS in MiB of one daemon in ``variant``."""
    is_all = variant == "all"
    port = free_port()
    extra = 'label_pattern = "IDLEPROBE-NONE*"\n'  # [bundles]: no test's stick is taken
    if variant == "metrics" or is_all:
        extra += metrics_section(port)
    if variant == "site" or is_all:
        extra += site_section(base / "pki")
    is_cluster = variant == "cluster" or is_all
    if is_cluster:
        assert kube is not None
        extra += cluster_section(kube)
    prefix = ["env", f"SSL_CERT_FILE={registry.ca_file}"]
    with Crio(base / "crio", command_prefix=prefix) as crio:
        agent = Agent(base / "agent", crio, watch_media=True, extra_config=extra)
        agent.python = python
        agent.extra_env = {"SSL_CERT_FILE": str(registry.ca_file)}
        agent.write_config()
        if not is_cluster:
            agent.write_set(SET_NAME, [ref])
        with agent:
            agent.wait_status(
                lambda s: set_state(s, SET_NAME) == "Pinned", what="set pinned", timeout_s=120
            )
            if variant == "metrics" or is_all:
                assert scrape(port) > 0
            assert agent.process is not None
            return steady_rss_kib(agent.process.pid, timeout_s=60.0) / 1024


@contextlib.contextmanager
def cluster_for(base: Path, ref: str, variants: list[str]) -> Iterator[KubeCluster | None]:
    if not {"cluster", "all"} & set(variants):
        yield None
        return
    with KubeCluster(base / "kube") as kube:
        install_deploy(kube)
        kube.create_node(NODE, {"node-role.kubernetes.io/worker": ""})
        apply(kube, pinned_image_set(SET_NAME, [ref], labels={"bench": "idle-rss"}))
        yield kube


def measure(opts: argparse.Namespace) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {v: [] for v in opts.variant}
    with tempfile.TemporaryDirectory(prefix="idle-rss-") as tmp:
        base = Path(tmp)
        python = runtime_python(base)
        image = TestImage(
            "bench/idle-rss", [LayerSpec(256 * 1024, seed=1), LayerSpec(64 * 1024, seed=2)]
        ).build()
        with Registry(base / "push") as plain:  # the test images are pushed over HTTP
            pushed = push(plain.url, image.repository, image)
            storage = plain.root
        with Registry(base / "registry", tls=True, storage_root=storage) as registry:
            ref = pushed.reference(registry.host)
            with cluster_for(base, ref, opts.variant) as kube:
                for round_no in range(opts.repeat):
                    for variant in opts.variant:
                        where = base / f"{variant}-{round_no}"
                        rss = run_variant(variant, where, registry, ref, kube=kube, python=python)
                        found[variant].append(rss)
                        print(
                            f"  {variant:<10} round {round_no + 1}: {rss:6.2f} MiB", file=sys.stderr
                        )
    return found


def report(found: dict[str, list[float]]) -> tuple[list[str], bool]:
    medians = {v: statistics.median(rss) for v, rss in found.items()}
    baseline = medians.get("reference")
    lines = ["variant      idle RSS MiB   delta MiB   ratio"]
    for variant, rss in medians.items():
        delta = f"{rss - baseline:+9.2f}" if baseline is not None else "        -"
        ratio = f"{rss / baseline:7.3f}" if baseline else "      -"
        lines.append(f"{variant:<12} {rss:12.2f}   {delta}   {ratio}")
    with_metrics = medians.get("metrics")
    is_within = with_metrics is None or with_metrics <= BUDGET_MIB
    if with_metrics is not None:
        verdict = "OK" if is_within else "OVER"
        lines.append(
            f"reference + metrics: {with_metrics:.2f} MiB, budget {BUDGET_MIB} MiB: {verdict}"
        )
    return lines, is_within


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.idle_rss", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--variant", action="append", choices=VARIANTS, help="default: all of them")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; the median is reported")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    opts = parser.parse_args(argv)
    opts.variant = opts.variant or list(VARIANTS)
    if "reference" not in opts.variant:
        opts.variant.insert(0, "reference")  # the baseline of every ratio, from the same run
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    found = measure(opts)
    lines, is_within = report(found)
    if opts.json:
        print(json.dumps({"rss_mib": found, "budget_mib": BUDGET_MIB}, indent=2))
    else:
        print("\n".join(lines))
    return 0 if is_within else 1


if __name__ == "__main__":
    sys.exit(main())
