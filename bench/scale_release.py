"""A synthetic OpenShift release at scale, for ``bench.release_scale``: planned, generated, pushed.

The shape is fixed and only its bytes scale with the size asked for (the compressed blob
bytes of the measured architecture, amd64), so at every size the release has the same
``IMAGES`` payload images and the same number of blobs:

* every payload image is an OCI index of two children, amd64 and arm64, as a real
  release's payload is multi-arch. The node reads one architecture; the arm64 children
  are there to be skipped, so each holds one small layer of its own (``OTHER_ARCH_BYTES``)
  and the registry's disk stays about the measured size;
* the amd64 children, at 16 GiB: three base layers shared by many images (80 MB by all,
  45 MB by two thirds, 160 MB by one sixth), four layers near 1 GB (0.85 to 1.0 GiB, one
  image each), and one layer of its own per image (a second for three in ten) drawn
  log-uniform in 10 to 300 MB, all scaled so the unique bytes sum to 16 GiB; then every
  layer is scaled by ``size / 16 GiB`` (at least ``MIN_LAYER_BYTES``);
* all payload images sit in one repository (``PAYLOAD_REPOSITORY``), as a real release's
  do (``quay.io/openshift-release-dev/ocp-v4.0-art-dev``), so a shared layer is pushed
  once; the multi-arch release image (tests/testenv/release.py) names them by digest.

Layers are random data (gzip -1: compressed bytes ≈ unpacked bytes), generated once per
(size, seed) into ``CACHE`` (under ~/.cache/nodeagent-testenv/, never in the repository)
and reused; the plan is a pure function of (size, seed, images).
"""

from __future__ import annotations

import hashlib
import math
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.testenv.crio_build import CACHE_ROOT
from tests.testenv.images import (
    BuiltImage,
    GeneratedLayer,
    LayerSpec,
    build_index,
    generate_layer,
    push,
)
from tests.testenv.release import (
    ARCHITECTURES,
    SyntheticRelease,
    image_of_layers,
    push_release_image,
)

GIB = 1 << 30
MB = 1_000_000
FULL_BYTES = 16 * GIB
"""The size of a real release's compressed blobs, one architecture (issue 31)."""
IMAGES = 180
CACHE = CACHE_ROOT / "release-scale"
PAYLOAD_REPOSITORY = "ocp/ocp-v4.0-art-dev"
MIN_LAYER_BYTES = 1024
OTHER_ARCH_BYTES = 4096
MEASURED_ARCH = "amd64"
VERSION = "4.99.31"
BASES = ((80 * MB, 1, True), (45 * MB, 3, False), (160 * MB, 6, True))
"""(full-scale bytes, n, is_every): held by every n-th image (index % n == 0), or by all
the others (index % n != 0): all, two thirds, one sixth."""
GIANTS = (GIB, int(0.95 * GIB), int(0.9 * GIB), int(0.85 * GIB))
OWN_RANGE = (10 * MB, 300 * MB)
SECOND_OWN_SHARE = 0.3
PUSH_THREADS = 6


@dataclass(frozen=True)
class ImagePlan:
    name: str
    """The component's name in image-references."""
    layers: tuple[LayerSpec, ...]
    """The measured architecture's layers, base first."""
    other: LayerSpec
    """The other architecture's one layer."""


def derived_seed(seed: int, label: object) -> int:
    digest = hashlib.sha256(f"release-scale:{seed}:{label}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


def _own_sizes(rng: random.Random, images: int) -> list[list[int]]:
    low, high = (math.log(v) for v in OWN_RANGE)
    sizes = []
    for _ in range(images):
        count = 2 if rng.random() < SECOND_OWN_SHARE else 1
        sizes.append([int(math.exp(rng.uniform(low, high))) for _ in range(count)])
    return sizes


def plan_release(size_bytes: int, seed: int, images: int = IMAGES) -> list[ImagePlan]:
    """The payload of a release of about ``size_bytes`` unique compressed layer bytes."""
    rng = random.Random(seed)
    own = _own_sizes(rng, images)
    fixed = sum(size for size, _, _ in BASES) + sum(GIANTS[:images])
    drawn = sum(sum(sizes) for sizes in own)
    own_scale = max(FULL_BYTES - fixed, drawn // 4) / drawn
    scale = size_bytes / FULL_BYTES

    def spec(full: float, label: object) -> LayerSpec:
        return LayerSpec(max(MIN_LAYER_BYTES, int(full * scale)), derived_seed(seed, label))

    bases = [spec(size, f"base-{n}") for n, (size, _, _) in enumerate(BASES)]
    plans = []
    for index in range(images):
        layers = [
            base
            for base, (_, n, is_every) in zip(bases, BASES, strict=True)
            if (index % n == 0) == is_every
        ]
        if index < len(GIANTS):
            layers.append(spec(GIANTS[index], f"giant-{index}"))
        layers += [spec(s * own_scale, f"own-{index}-{n}") for n, s in enumerate(own[index])]
        other = LayerSpec(OTHER_ARCH_BYTES, derived_seed(seed, f"other-{index}"))
        plans.append(ImagePlan(f"component-{index:03d}", tuple(layers), other))
    return plans


def unique_layers(plans: list[ImagePlan]) -> dict[LayerSpec, None]:
    return dict.fromkeys(spec for plan in plans for spec in plan.layers)


def describe(plans: list[ImagePlan]) -> dict[str, Any]:
    """What the plan holds, for the report: counts and the size spread."""
    sizes = sorted(spec.size_bytes for spec in unique_layers(plans))
    shared = sum(1 for s in unique_layers(plans) if sum(s in p.layers for p in plans) > 1)

    def pct(q: float) -> int:
        return sizes[min(len(sizes) - 1, int(q * len(sizes)))]

    return {
        "images": len(plans),
        "architectures": list(ARCHITECTURES),
        "measured_architecture": MEASURED_ARCH,
        "unique_layers": len(sizes),
        "shared_layers": shared,
        "layer_bytes": sum(sizes),
        "layer_bytes_p10_p50_p90_max": [pct(0.1), pct(0.5), pct(0.9), sizes[-1]],
    }


def generate(plans: list[ImagePlan], threads: int = 2) -> dict[LayerSpec, GeneratedLayer]:
    """Every layer of ``plans`` in the cache (made once; gzip runs outside the GIL)."""
    specs = list(unique_layers(plans)) + [plan.other for plan in plans]
    specs.sort(key=lambda s: -s.size_bytes)  # the big ones first: the threads end together
    with ThreadPoolExecutor(max_workers=threads) as pool:
        made = list(pool.map(lambda s: generate_layer(s, CACHE), specs))
    return dict(zip(specs, made, strict=True))


def push_scaled_release(
    registry_url: str, host: str, work: Path, plans: list[ImagePlan]
) -> tuple[SyntheticRelease, dict[str, BuiltImage]]:
    """Generate (or reuse) the layers, push every payload index and the release: the
    release, and component → its measured-architecture image."""
    layers = generate(plans)
    other_arch = next(a for a in ARCHITECTURES if a != MEASURED_ARCH)

    def push_one(plan: ImagePlan) -> tuple[str, BuiltImage]:
        main = image_of_layers(PAYLOAD_REPOSITORY, MEASURED_ARCH, [layers[s] for s in plan.layers])
        other = image_of_layers(PAYLOAD_REPOSITORY, other_arch, [layers[plan.other]])
        pushed = push(registry_url, PAYLOAD_REPOSITORY, build_index([main, other]))
        return pushed.reference(host), main

    # Images 0 and 1 hold every base layer: pushed first, alone; the others find them by HEAD.
    first = [push_one(plan) for plan in plans[:2]]
    with ThreadPoolExecutor(max_workers=PUSH_THREADS) as pool:
        done = [*first, *pool.map(push_one, plans[2:])]
    payload = {plan.name: ref for plan, (ref, _) in zip(plans, done, strict=True)}
    measured = {plan.name: image for plan, (_, image) in zip(plans, done, strict=True)}
    digest, by_arch = push_release_image(
        registry_url, work, version=VERSION, payload=payload, cache_dir=CACHE
    )
    return SyntheticRelease(host, VERSION, digest, by_arch, payload), measured
