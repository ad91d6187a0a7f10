"""``[store] registry_sets`` benchmark: what keeping a registry set in the store costs, and
what it buys.

A loopback registry holds N images (default 6 x (8 MB shared base + 24 MB own layer),
~160 MB compressed). Per round, with a fresh CRI-O and a fresh state directory each:

* ``off``: the real daemon with the option off, from process start until the set is
  Pinned (the registry pull);
* ``on``: the same with ``registry_sets = true`` (fetched once into the store, pulled by
  CRI-O from the store through the loopback mirror), then CRI-O killed, its storage
  deleted and started again with the registry stopped: ``restore`` is from CRI-O's start
  until every image is back and pinned;
* ``fill``: ``adapters.store.registry_sets.RegistrySets.store`` alone into an empty store,
  and ``fetcher``: ``adapters.bundles.fetcher.ImageFetcher`` (what ``nodeagent bundle
  create`` uses: one hash per blob) fetching the same images into a directory.

Run as root::

    .venv/bin/python -m bench.registry_sets [--rounds 3] [--images 6] [--json]

It prints seconds per round and the ratios on/off and fill/fetcher (medians). On loopback the
registry is as fast as the disk, so on/off is the worst case: the store's copy is a second
pass over the bytes (two SHA-256 per blob: the registry client's and the store's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nodeagent.adapters.bundles.fetcher import ImageFetcher
from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.adapters.store.copier import StoreLimits
from nodeagent.adapters.store.registry_sets import RegistrySets
from nodeagent.authfile import AuthStore
from nodeagent.references import parse_pinned_image_ref
from nodeagent.registries import Platform
from nodeagent.sync.copies import SetImages
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.images import make_image_set, push
from tests.testenv.packages import ensure_packages
from tests.testenv.registry import Registry

MB = 1_000_000
AMD64 = Platform("linux", "amd64")
ON = "[store]\nregistry_sets = true\n"


def progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def is_back(status: dict[str, Any]) -> bool:
    loss = status.get("imageLoss") or {}
    return loss.get("resolved") is True and set_state(status, "big") == "Pinned"


def daemon_round(
    work: Path, registry: Registry, refs: list[str], *, is_on: bool
) -> dict[str, float]:
    with Crio(work / "crio", insecure_registries=[registry.host]) as crio:
        agent = Agent(work / "agent", crio, extra_config=ON if is_on else "")
        agent.write_config()
        agent.write_set("big", refs)
        started_s = time.monotonic()
        with agent:
            agent.wait_status(
                lambda s: set_state(s, "big") == "Pinned", what="pinned", timeout_s=600
            )
            found = {"pin_s": time.monotonic() - started_s}
            if is_on:
                registry.stop()
                try:
                    crio.kill()
                    shutil.rmtree(crio.storage_root)
                    crio.start()
                    started_s = time.monotonic()
                    agent.wait_status(is_back, what="every image back", timeout_s=600)
                    found["restore_s"] = time.monotonic() - started_s
                finally:
                    registry.start()
    shutil.rmtree(work, ignore_errors=True)
    return found


async def fill_round(work: Path, registry: Registry, refs: list[str]) -> dict[str, float]:
    client = RegistryClient(insecure={registry.host}, timeout_s=60.0)
    started_s = time.monotonic()
    wanted = [SetImages("big", tuple(refs), tuple(refs), ())]
    outcome = await RegistrySets(
        work / "store", client, lambda _r: None, AMD64, StoreLimits()
    ).store(wanted, None)
    fill_s = time.monotonic() - started_s
    (work / "fetched").mkdir(parents=True)
    fetcher = ImageFetcher(client, AuthStore.empty("none"), work / "fetched", None)
    started_s = time.monotonic()
    plans = [await fetcher.plan(parse_pinned_image_ref(ref), AMD64) for ref in refs]
    await fetcher.fetch_layers(plans, work / "fetched")
    fetch_s = time.monotonic() - started_s
    shutil.rmtree(work, ignore_errors=True)
    return {"fill_s": fill_s, "fetch_s": fetch_s, "fill_mb": outcome.fetched_bytes / MB}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    ensure_packages()
    with tempfile.TemporaryDirectory(prefix="bench-regsets-") as tmp:
        work = Path(tmp)
        with Registry(work / "registry") as registry:
            images = make_image_set(
                opts.images, layer_size_bytes=24 << 20, shared_base_size_bytes=8 << 20, seed=7
            )
            refs = [
                push(registry.url, i.repository, i.build()).reference(registry.host) for i in images
            ]
            rounds: list[dict[str, float]] = []
            for n in range(opts.rounds):
                progress(f"round {n + 1}/{opts.rounds}")
                found = daemon_round(work / f"off{n}", registry, refs, is_on=False)
                on = daemon_round(work / f"on{n}", registry, refs, is_on=True)
                found |= {"on_pin_s": on["pin_s"], "restore_s": on["restore_s"]}
                found |= asyncio.run(fill_round(work / f"fill{n}", registry, refs))
                rounds.append(found)
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    result = {
        "rounds": rounds,
        "median": median,
        "on_over_off": median["on_pin_s"] / median["pin_s"],
        "fill_over_fetcher": median["fill_s"] / median["fetch_s"],
    }
    if opts.json:
        print(json.dumps(result, indent=1))
        return 0
    for r in rounds:
        print(
            f"off {r['pin_s']:.1f}s  on {r['on_pin_s']:.1f}s  restore {r['restore_s']:.1f}s  "
            f"fill {r['fill_mb']:.0f} MB {r['fill_s']:.2f}s "
            f"({r['fill_mb'] / r['fill_s']:.0f} MB/s)  "
            f"fetcher {r['fetch_s']:.2f}s"
        )
    print(f"on/off {result['on_over_off']:.2f}  fill/fetcher {result['fill_over_fetcher']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
