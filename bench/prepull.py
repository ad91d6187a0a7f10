"""Pre-pull benchmark: nodeagent against a serial puller and the MCD's policy, in one run.

Every strategy pulls the same images from the same registry storage into a FRESH
CRI-O (cold vfs store, new process), one after another; ratios compare medians
measured in this run. Run as root::

    .venv/bin/python -m bench.prepull [--quick] [--repeat N] [--json]

Link profiles (``--profiles``, both by default):

* ``loopback``: the registry on 127.0.0.1. Pulls are CPU work in CRI-O.
* ``link``: the registry inside a private network namespace behind an emulated
  link (``tests/testenv/link.py``): ``--link-rtt-ms`` round trip (50 ms by
  default, half each way) and, with ``--link-rate-mbit``, a rate limit each way.
  CRI-O, on the host, reaches it only through that link.

The daemon runs from a venv holding only nodeagent's runtime dependencies
(built in the temp dir with pip; ``--agent-python`` names another interpreter),
so its RSS is what a node would see, without dev tools such as ``rich``.

Strategies:

* ``serial``: one CRI PullImage after another (``CriClient``).
* ``mcd``: the machine-config-daemon's pacing: 5 workers on one queue, each
  sleeping 1 s after every pull; done when the last pull returns (MCD marks an
  image done before its pause). Its disk check and pin reload are NOT included.
* ``prepuller``: nodeagent's ``PrePuller`` alone with its default ``PullPolicy``.
* ``nodeagent``: the real daemon, from process start until the set's status
  says Pinned: interpreter start, spec load, manifest fetches for disk
  admission, pulls, drop-in, CRI-O reload and pin verification.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from nodeagent.adapters.cri.client import CriClient
from nodeagent.logs import event_of
from nodeagent.prepull import PrePuller, PullPolicy
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.host_view import own_containers_dir
from tests.testenv.images import make_image_set, push
from tests.testenv.link import EmulatedLink
from tests.testenv.packages import ensure_packages
from tests.testenv.registry import Registry

MIB = 1 << 20
PULL_TIMEOUT_S = 600.0
SET_NAME = "bench"
STRATEGIES = ("serial", "mcd", "prepuller", "nodeagent")
PROFILES = ("loopback", "link")
REPO = Path(__file__).resolve().parents[1]
LABELS = {
    "serial": "serial (1 pull at a time)",
    "mcd": "MCD policy (5 workers, 1 s pause)",
    "prepuller": "PrePuller only (no admission, no pins)",
    "nodeagent": "nodeagent daemon, start->Pinned",
}
# Daemon log events that bound its phases, in order (first occurrence, except image_pulled).
PHASES = (
    ("startup", "start", "daemon_started"),
    ("specs+manifests+admission", "daemon_started", "pulls_started"),
    ("pulls", "pulls_started", "last_image_pulled"),
    ("pin: list+write+reload+verify", "last_image_pulled", "set_pinned"),
    ("status written+seen", "set_pinned", "pinned_seen"),
)
_CRIO_PULL = re.compile(r'time="([^"]+)".*msg="(Pulling|Pulled) image: ([^"\s]+)')
_CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    """A strategy did not leave every image in the runtime."""


@dataclass
class Run:
    profile: str
    strategy: str
    wall_s: float
    cpu_s: dict[str, float]
    store_mib: float
    crio_pull_mean_s: float
    runtime: str
    extra: dict[str, float] = field(default_factory=dict)
    received_mib: float = float("nan")
    """Bytes that crossed the emulated link towards the host (link profile only)."""


# ------------------------------------------------------------------ /proc and logs


def cpu_s(pid: int) -> float:
    """utime + stime (+ reaped children) of ``pid`` in seconds."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in after_name[11:15]) / _CLK_TCK


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(key)


def tree_mib(root: Path) -> float:
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512  # noqa: PTH118
            except FileNotFoundError:
                continue
    return total / MIB


class LogStamps(threading.Thread):
    """Stamps each new line of a log (polled every 10 ms) with the monotonic clock."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.lines: list[tuple[float, str]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        offset, partial = 0, b""
        while not self._stop_event.wait(0.01):
            try:
                with self.path.open("rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                continue
            offset += len(data)
            *done, partial = (partial + data).split(b"\n")
            now = time.monotonic()
            self.lines += [(now, line.decode(errors="replace")) for line in done]

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def events(self) -> dict[str, float]:
        """First time of each event; ``last_image_pulled`` is the last ``image_pulled``."""
        found: dict[str, float] = {}
        for stamp, line in self.lines:
            event = event_of(line) or ""
            found.setdefault(event, stamp)
            if event == "image_pulled":
                found["last_image_pulled"] = stamp
        return found


def crio_pull_mean_s(log: Path) -> float:
    """Mean Pulling->Pulled time per image from CRI-O's own (timestamped) log."""
    began: dict[str, datetime] = {}
    spans: list[float] = []
    for line in log.read_text(errors="replace").splitlines():
        match = _CRIO_PULL.search(line)
        if match is None:
            continue
        when = datetime.fromisoformat(match[1])
        if match[2] == "Pulling":
            began[match[3]] = when
        elif match[3] in began:
            spans.append((when - began.pop(match[3])).total_seconds())
    return statistics.fmean(spans) if spans else float("nan")


# ------------------------------------------------------------------ strategies


async def pull_serial(endpoint: str, refs: list[str]) -> None:
    async with CriClient(endpoint, timeout_s=PULL_TIMEOUT_S) as cri:
        for ref in refs:
            await cri.pull_image(ref)


async def pull_mcd(endpoint: str, refs: list[str], workers: int, pause_s: float) -> float:
    """Seconds until the last pull returned (the trailing pause of each worker is not counted)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for ref in refs:
        queue.put_nowait(ref)
    started = last_done = time.monotonic()

    async def worker(cri: CriClient) -> None:
        nonlocal last_done
        while not queue.empty():
            await cri.pull_image(queue.get_nowait())
            last_done = time.monotonic()
            if not queue.empty():
                await asyncio.sleep(pause_s)

    async with CriClient(endpoint, timeout_s=PULL_TIMEOUT_S) as cri:
        await asyncio.gather(*(worker(cri) for _ in range(workers)))
    return last_done - started


async def pull_prepuller(endpoint: str, refs: list[str], policy: PullPolicy) -> None:
    async with CriClient(endpoint, timeout_s=PULL_TIMEOUT_S) as cri:
        results = await PrePuller(cri, lambda _ref: None, policy).pull_all(refs)
    failed = [r for r in results.values() if not r.is_pulled]
    if failed:
        raise BenchError(f"PrePuller failed {len(failed)} images, first: {failed[0]}")


async def missing_images(endpoint: str, refs: list[str]) -> list[str]:
    async with CriClient(endpoint, timeout_s=60) as cri:
        return [ref for ref in refs if await cri.image_status(ref) is None]


async def runtime_version(endpoint: str) -> str:
    async with CriClient(endpoint, timeout_s=60) as cri:
        v = await cri.version()
    return f"{v.runtime_name} {v.runtime_version} (CRI {v.runtime_api_version})"


def wait_idle(agent: Agent, stamps: LogStamps, pid: int, timeout_s: float = 60.0) -> None:
    """Until the first sync logged its end and neither CPU time nor the log moved for 2 s."""
    deadline = time.monotonic() + timeout_s
    last = (-1.0, -1)
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        now = (cpu_s(pid), len(stamps.lines))
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif "sync_finished" in agent.log_text() and time.monotonic() - quiet_since >= 2.0:
            return
        time.sleep(0.1)
    raise BenchError(f"nodeagent did not become idle within {timeout_s:.0f}s")


def run_agent(
    base: Path, crio: Crio, refs: list[str], opts: argparse.Namespace
) -> dict[str, float]:
    settings = [f"concurrency = {opts.concurrency}"] if opts.concurrency else []
    settings += opts.pull_setting
    agent = Agent(base / "agent", crio, pull_settings="\n".join(settings))
    agent.python = opts.agent_python
    agent.write_config()
    agent.write_set(SET_NAME, refs)
    stamps = LogStamps(agent.log_path)
    stamps.start()
    started = time.monotonic()
    agent.start()
    process = agent.process
    assert process is not None
    pid = process.pid
    try:
        agent.wait_status(
            lambda s: set_state(s, SET_NAME) == "Pinned",
            what="set Pinned",
            timeout_s=opts.timeout_s,
        )
        wall_s = time.monotonic() - started
        busy_cpu_s = cpu_s(pid)
        wait_idle(agent, stamps, pid)
        result = {
            "wall_s": wall_s,
            "daemon_cpu_s_to_pinned": busy_cpu_s,
            "idle_rss_mib": status_kib(pid, "VmRSS") / 1024,
            "peak_rss_mib": status_kib(pid, "VmHWM") / 1024,
            "syncs": float(agent.log_text().count("sync_finished:")),
        }
    finally:
        stamps.stop()
        if process.poll() is None:
            try:
                agent.stop()
            except subprocess.TimeoutExpired:
                agent.kill()
    events = stamps.events() | {"start": started, "pinned_seen": started + wall_s}
    for name, begin, end in PHASES:
        if begin in events and end in events:
            result[f"phase {name} s"] = events[end] - events[begin]
    return result


# ------------------------------------------------------------------ one measurement


@contextmanager
def metered(pids: dict[str, int]) -> Iterator[dict[str, float]]:
    """CPU seconds each process spent inside the block (filled in on exit)."""
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    spent: dict[str, float] = {}
    yield spent
    spent.update({name: cpu_s(pid) - before[name] for name, pid in pids.items()})


@dataclass
class Source:
    """Where a profile's CRI-O pulls from: the registry, its references, the processes to meter."""

    profile: str
    registry: Registry
    refs: list[str]
    pids: dict[str, int]
    received_bytes: Callable[[], int] | None = None


def measure(strategy: str, base: Path, source: Source, opts: argparse.Namespace) -> Run:
    refs = source.refs
    with Crio(base / "crio", insecure_registries=[source.registry.host]) as crio:
        assert crio.process is not None
        os.sync()
        extra: dict[str, float] = {}
        pids = {"crio": crio.process.pid, **source.pids}
        received_before = source.received_bytes() if source.received_bytes else 0
        with metered(pids) as spent:
            started = time.monotonic()
            if strategy == "serial":
                asyncio.run(pull_serial(crio.endpoint, refs))
            elif strategy == "mcd":
                extra["wall_s"] = asyncio.run(
                    pull_mcd(crio.endpoint, refs, opts.mcd_workers, opts.mcd_pause_s)
                )
            elif strategy == "prepuller":
                policy = PullPolicy(concurrency=opts.concurrency or PullPolicy().concurrency)
                asyncio.run(pull_prepuller(crio.endpoint, refs, policy))
            else:
                extra = run_agent(base, crio, refs, opts)
            wall_s = extra.pop("wall_s", time.monotonic() - started)
        received_mib = (
            (source.received_bytes() - received_before) / MIB
            if source.received_bytes
            else float("nan")
        )
        missing = asyncio.run(missing_images(crio.endpoint, refs))
        if missing:
            raise BenchError(f"{strategy}: {len(missing)} images missing, first {missing[0]}")
        runtime = asyncio.run(runtime_version(crio.endpoint))
        store_mib = tree_mib(crio.storage_root)
        pull_s = crio_pull_mean_s(crio.log_path)
        return Run(
            source.profile, strategy, wall_s, spent, store_mib, pull_s, runtime, extra, received_mib
        )


# ------------------------------------------------------------------ report


def median_of(runs: list[Run], get: Callable[[Run], float]) -> float:
    return statistics.median(get(r) for r in runs)


def _ratio(wall: dict[str, float], a: str, b: str) -> float | None:
    return wall[a] / wall[b] if a in wall and b in wall else None


def summarize(runs: dict[str, list[Run]], nproc: int) -> dict[str, Any]:
    """Medians and checks of one profile's runs (``runs`` by strategy)."""
    wall = {s: median_of(rs, lambda r: r.wall_s) for s, rs in runs.items()}
    first = next(iter(runs.values()))
    # What the metered processes' CPU would take spread perfectly over every CPU.
    floor_s = median_of(first, lambda r: sum(r.cpu_s.values())) / nproc
    agent = runs.get("nodeagent", [])
    extra_keys = sorted({k for r in agent for k in r.extra})
    agent_extra = {
        k: statistics.median(r.extra.get(k, float("nan")) for r in agent) for k in extra_keys
    }
    checks = [
        ("nodeagent/serial", _ratio(wall, "nodeagent", "serial"), 0.5),
        ("nodeagent/MCD", _ratio(wall, "nodeagent", "mcd"), 0.8),
        ("idle RSS MiB", agent_extra.get("idle_rss_mib"), 40.0),
        ("peak RSS MiB", agent_extra.get("peak_rss_mib"), None),
        ("PrePuller only/serial (info)", _ratio(wall, "prepuller", "serial"), None),
        ("PrePuller only/MCD (info)", _ratio(wall, "prepuller", "mcd"), None),
        (f"CPU floor/{first[0].strategy} (info)", floor_s / wall[first[0].strategy], None),
    ]
    return {
        "wall_s": wall,
        "cpu_floor_s": floor_s,
        "nodeagent": agent_extra,
        "checks": [
            {
                "name": name,
                "value": value,
                "target_max": target,
                "result": None if target is None else ("PASS" if value <= target else "MISS"),
            }
            for name, value, target in checks
            if value is not None
        ],
    }


def render_profile(profile: str, runs: dict[str, list[Run]], summary: dict[str, Any]) -> list[str]:
    lines = [
        f"== {profile}",
        f"{'strategy':36} {'wall s':>8} {'CRI-O CPU s':>12} {'reg CPU s':>10} "
        f"{'link CPU s':>10} {'pull/img s':>10} {'store MiB':>10} {'link MiB':>9}",
    ]
    for strategy, rs in runs.items():

        def med(get: Callable[[Run], float], rs: list[Run] = rs) -> float:
            return median_of(rs, get)

        lines.append(
            f"{LABELS[strategy]:36} {med(lambda r: r.wall_s):8.2f} "
            f"{med(lambda r: r.cpu_s['crio']):12.2f} {med(lambda r: r.cpu_s['registry']):10.2f} "
            f"{med(lambda r: r.cpu_s.get('link', 0.0)):10.2f} "
            f"{med(lambda r: r.crio_pull_mean_s):10.2f} {med(lambda r: r.store_mib):10.0f} "
            f"{med(lambda r: r.received_mib):9.0f}"
        )
    lines += [
        f"CPU floor = {next(iter(runs))}'s CRI-O + registry + link CPU / CPUs = "
        f"{summary['cpu_floor_s']:.2f} s",
        "",
        "nodeagent daemon (median):",
    ]
    lines += [f"  {key:40} {value:8.2f}" for key, value in summary["nodeagent"].items()]
    lines += ["", f"{'check':30} {'value':>8} {'target':>8}  result"]
    for c in summary["checks"]:
        target = "-" if c["target_max"] is None else f"<= {c['target_max']:g}"
        lines.append(f"{c['name']:30} {c['value']:8.2f} {target:>8}  {c['result'] or '-'}")
    return [*lines, ""]


def render_table(report: dict[str, Any]) -> str:
    m, w = report["machine"], report["workload"]
    lines = [
        f"workload: {w['images']} images x ({w['base_mib']:g} MiB shared base + "
        f"{w['layer_mib']:g} MiB own layer), cold vfs store per run, median of {w['repeat']}",
        f"machine: {m['nproc']} CPUs, {m['mem_gib']:.1f} GiB, Linux {m['kernel']}, "
        f"{m['runtime']}, Python {m['python']}",
        f"link profile: {w['link']}",
        f"nodeagent: {w['concurrency']} pulls in flight; [pull] {w['pull_settings'] or 'defaults'}",
        f"daemon interpreter: {m['agent_python']} ('rich' importable: {m['rich_installed']})",
        "",
        "daemon wall = process start -> status Pinned: includes interpreter start, manifest",
        "fetches for disk admission, drop-in write, CRI-O reload and pin verification;",
        "MCD = its pull loop only (no disk check, no reload). The CPU floor is a lower bound",
        "for any strategy doing the same work on this machine.",
        "",
    ]
    for profile, runs in report["runs"].items():
        lines += render_profile(profile, runs, report["summary"][profile])
    return "\n".join(lines).rstrip()


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.prepull", description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=50, help="number of images (default 50)")
    p.add_argument("--layer-mb", type=float, default=6, help="own layer per image, MiB (6)")
    p.add_argument("--base-mb", type=float, default=4, help="shared base layer, MiB (4)")
    p.add_argument("--quick", action="store_true", help="10 images instead of --images")
    p.add_argument("--repeat", type=int, default=1, help="runs per strategy; median (1)")
    p.add_argument("--seed", type=int, default=2024, help="image content seed (2024)")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset")
    p.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated subset")
    p.add_argument("--link-rtt-ms", type=float, default=50.0, help="link round trip (50)")
    p.add_argument("--link-rate-mbit", type=float, help="link rate each way (no limit)")
    p.add_argument("--concurrency", type=int, help="nodeagent's pulls in flight (its default)")
    p.add_argument(
        "--pull-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a line for nodeagent's [pull] section, e.g. 'shared_layer_min_bytes = \"0\"'",
    )
    p.add_argument("--mcd-workers", type=int, default=5)
    p.add_argument("--mcd-pause-s", type=float, default=1.0)
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per nodeagent run")
    p.add_argument("--agent-python", help="interpreter for the daemon (default: a runtime venv)")
    p.add_argument("--workdir", type=Path, help="parent of the temp dir (default: $TMPDIR)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--json-out", type=Path, help="also write the JSON report to this file")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.images = 10
    opts.strategies = _subset(p, opts.strategies, STRATEGIES)
    opts.profiles = _subset(p, opts.profiles, PROFILES)
    return opts


def _subset(parser: argparse.ArgumentParser, text: str, known: tuple[str, ...]) -> list[str]:
    wanted = [item.strip() for item in text.split(",") if item.strip()]
    unknown = sorted(set(wanted) - set(known))
    if unknown or not wanted:
        parser.error(f"choose from {', '.join(known)}; got {text!r}")
    return [item for item in known if item in wanted]


def progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def push_images(registry: Registry, opts: argparse.Namespace) -> list[str]:
    images = make_image_set(
        opts.images,
        layer_size_bytes=int(opts.layer_mb * MIB),
        shared_base_size_bytes=int(opts.base_mb * MIB),
        seed=opts.seed,
    )
    return [push(registry.url, i.repository, i.build()).reference(registry.host) for i in images]


def runtime_venv(base: Path) -> str:
    """A venv with nodeagent and its runtime dependencies only (what a node installs)."""
    venv = base / "agent-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]
    subprocess.run([*pip, str(REPO)], check=True)
    return str(venv / "bin" / "python")


def machine(runtime: str, agent_python: str) -> dict[str, Any]:
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    probe = "import importlib.util; print(importlib.util.find_spec('rich') is not None)"
    rich = subprocess.run([agent_python, "-c", probe], capture_output=True, text=True, check=True)
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "mem_gib": mem_kib / 1024 / 1024,
        "kernel": platform.release(),
        "runtime": runtime,
        "python": platform.python_version(),
        "agent_python": agent_python,
        "rich_installed": rich.stdout.strip() == "True",
    }


def link_text(opts: argparse.Namespace) -> str:
    rate = f"{opts.link_rate_mbit:g} Mbit/s each way" if opts.link_rate_mbit else "no rate limit"
    return f"{opts.link_rtt_ms:g} ms RTT ({opts.link_rtt_ms / 2:g} ms each way), {rate}"


@contextmanager
def sources(base: Path, opts: argparse.Namespace) -> Iterator[list[Source]]:
    """The loopback registry and, behind the emulated link, one serving the same storage."""
    with contextlib.ExitStack() as stack:
        loop = stack.enter_context(Registry(base / "registry"))
        progress(f"pushing {opts.images} images to {loop.url}")
        refs = push_images(loop, opts)
        assert loop.pid is not None
        found = []
        if "loopback" in opts.profiles:
            found.append(Source("loopback", loop, refs, {"registry": loop.pid}))
        if "link" in opts.profiles:
            link = stack.enter_context(
                EmulatedLink(base / "link", rtt_ms=opts.link_rtt_ms, rate_mbit=opts.link_rate_mbit)
            )
            far = stack.enter_context(
                Registry(
                    base / "registry-link",
                    storage_root=loop.root,
                    address=link.netns_address,
                    command_prefix=link.exec_prefix,
                )
            )
            assert far.pid is not None and link.wire_pid is not None
            far_refs = [far.host + ref.removeprefix(loop.host) for ref in refs]
            progress(f"link: {link_text(opts)}; registry at {far.url} in {link.netns}")
            counter = Path(f"/sys/class/net/{link.host_device}/statistics/rx_bytes")
            pids = {"registry": far.pid, "link": link.wire_pid}
            found.append(Source("link", far, far_refs, pids, lambda: int(counter.read_text())))
        yield found


def bench(base: Path, opts: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, dict[str, list[Run]]] = {
        p: {s: [] for s in opts.strategies} for p in opts.profiles
    }
    if opts.agent_python is None and "nodeagent" in opts.strategies:
        progress("building a venv with nodeagent's runtime dependencies only")
        opts.agent_python = runtime_venv(base)
    with sources(base, opts) as found:
        for round_no in range(1, opts.repeat + 1):
            for source in found:
                for strategy in opts.strategies:
                    progress(f"round {round_no}/{opts.repeat}: {source.profile} {strategy}")
                    where = base / f"{source.profile}-{strategy}-{round_no}"
                    run = measure(strategy, where, source, opts)
                    progress(f"  {run.wall_s:.2f} s")
                    runs[source.profile][strategy].append(run)
    workload = {
        "images": opts.images,
        "base_mib": opts.base_mb,
        "layer_mib": opts.layer_mb,
        "repeat": opts.repeat,
        "seed": opts.seed,
        "link": link_text(opts) if "link" in opts.profiles else "not run",
        "concurrency": opts.concurrency or PullPolicy().concurrency,
        "pull_settings": opts.pull_setting,
    }
    first = next(iter(next(iter(runs.values())).values()))[0]
    host = machine(first.runtime, opts.agent_python or sys.executable)
    return {
        "machine": host,
        "workload": workload,
        "runs": runs,
        "summary": {p: summarize(rs, host["nproc"]) for p, rs in runs.items()},
    }


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if os.geteuid() != 0:
        print("bench.prepull starts CRI-O: run it as root", file=sys.stderr)
        return 2
    ensure_packages()
    base = Path(tempfile.mkdtemp(prefix="nodeagent-bench-", dir=opts.workdir))
    try:
        with own_containers_dir():
            report = bench(base, opts)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    runs = {
        p: {s: [asdict(r) for r in rs] for s, rs in by_strategy.items()}
        for p, by_strategy in report["runs"].items()
    }
    text = json.dumps(dict(report, runs=runs), indent=2)
    if opts.json_out is not None:
        opts.json_out.write_text(text + "\n")
    print(text if opts.json else render_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
