"""``nodeagent site status | wait`` (``nodeagent.cli.main`` registers them): the site view.

Run by an admin (or a pipeline) with credentials that may list Nodes and
NodeImageStatuses: ``--kubeconfig``, else ``[cluster] kubeconfig``; ``--in-cluster``: the
pod's service account (a Job in the cluster). ``status`` prints, per
bundle id (one with ``--bundle``), the nodes that hold it (complete or being fetched, from
their NodeImageHoldings), have it pinned, fail and why, the bytes left and the nodes that
hold a different manifest under the same id.
``wait`` polls until every Node in scope reports the bundle (``--set``: that set) pinned,
all with the same manifest, and exits 0 with a one-line summary; at ``--timeout`` it
exits 75 naming each laggard and why. The scope is the Nodes ``--selector`` matches, else
the bundle's target as the nodes holding it publish it (every Node while none does);
holders that publish different targets: 78, pass ``--selector``
(``nodeagent.cluster.scope``). The API server unreachable: 69; denied: 77; a bad
kubeconfig: 78. Pure logic: ``nodeagent.cluster.site``;
docs/cluster.md, "Site view".
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from nodeagent.cli import output
from nodeagent.config import Config
from nodeagent.errors import (
    ApiRequestRejected,
    ApiUnreachable,
    ConfigInvalid,
    PeerHoldingsInvalid,
    TransientError,
)
from nodeagent.strict import clip

if TYPE_CHECKING:
    # Imported by the commands that use them: `nodeagent run` parses these arguments too.
    from nodeagent.adapters.kube import KubeApi
    from nodeagent.cluster.holdings import Holdings
    from nodeagent.cluster.scope import Scope
    from nodeagent.cluster.site_view import BundleView

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

EXIT_TIMEOUT = TransientError.exit_code
"""75 (EX_TEMPFAIL): the wait ended with laggards; run it again later."""
STALE_HEARTBEATS = 3
"""A node in progress is stale after this many heartbeats without a write."""
_LINE_CHARS = 2000


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser("site", help="the bundle on every node of the cluster (admin)")
    commands = parser.add_subparsers(dest="site_command", required=True)
    status = commands.add_parser("status", help="per bundle: who holds, pinned, fails, bytes left")
    status.add_argument("--bundle", metavar="ID", help="only this bundle id")
    status.add_argument("--set", dest="set_name", metavar="NAME", help="judge this set's pinning")
    wait = commands.add_parser("wait", help="exit 0 once every node in scope has it pinned")
    wait.add_argument("--bundle", required=True, metavar="ID", help="the bundle id")
    wait.add_argument("--set", dest="set_name", metavar="NAME", help="wait for this set instead")
    wait.add_argument(
        "--timeout", type=_seconds, default=3600.0, metavar="SECONDS",
        help="give up (exit 75) after this long (default 3600)",
    )  # fmt: skip
    wait.add_argument(
        "--interval", type=_seconds, default=5.0, metavar="SECONDS",
        help="seconds between two reads of the API server (default 5)",
    )  # fmt: skip
    for command in (status, wait):
        _add_common(command)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--in-cluster", action="store_true",
        help="use the pod's service account instead of a kubeconfig (a Job in the cluster)",
    )  # fmt: skip
    parser.add_argument(
        "--kubeconfig", type=Path, help="credentials that may list Nodes and NodeImageStatuses "
        "(default: [cluster] kubeconfig)",
    )  # fmt: skip
    parser.add_argument(
        "--selector", default=None, metavar="SEL",
        help="only Nodes matching this label selector (kubectl -l syntax; default: the "
        "bundle's target as the nodes holding it publish it, else every Node)",
    )  # fmt: skip
    parser.add_argument(
        "--stale-after", type=_seconds, default=None, metavar="SECONDS",
        help="a node in progress without a status write for this long is stale "
        "(default: 3 x the larger of [cluster] heartbeat_s and progress_interval_s)",
    )  # fmt: skip


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 7 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 < s <= 604800)")
    return value


def cmd_site(config: Config, args: argparse.Namespace) -> int:
    command = _status if args.site_command == "status" else _wait
    return asyncio.run(command(config, args))


# ---------------------------------------------------------------- reading


def _api(config: Config, args: argparse.Namespace) -> KubeApi:
    # lightkube is loaded only when a site command runs
    from nodeagent.adapters.kube import SERVICE_ACCOUNT_DIR, KubeApi  # noqa: PLC0415
    from nodeagent.cluster.objects import FIELD_MANAGER  # noqa: PLC0415
    from nodeagent.config.rerooting import reroot  # noqa: PLC0415

    kubeconfig = None if args.in_cluster else args.kubeconfig or config.cluster.kubeconfig
    return KubeApi(
        kubeconfig,
        timeout_s=config.cluster.request_timeout_s,
        field_manager=FIELD_MANAGER,
        service_account=reroot(SERVICE_ACCOUNT_DIR, args.root),
    )


def _stale_after_s(config: Config, args: argparse.Namespace) -> float:
    if args.stale_after is not None:
        return float(args.stale_after)
    cluster = config.cluster
    return STALE_HEARTBEATS * max(cluster.heartbeat_s, cluster.progress_interval_s)


@dataclass(frozen=True)
class _Site:
    node_objects: list[Any]
    """Every Node object."""
    statuses: dict[str, Any]
    """Every NodeImageStatus by node name."""
    holdings: dict[str, Holdings]
    """Every valid NodeImageHoldings by node name."""
    unreadable: dict[str, str]
    """Node → why its NodeImageHoldings was refused (clipped)."""

    def scope(self, bundle_id: str | None, selector_text: str | None) -> Scope:
        from nodeagent.cluster.scope import choose_scope  # noqa: PLC0415

        return choose_scope(self.node_objects, self.holdings, bundle_id, selector_text)


async def _read(api: KubeApi, selector_text: str | None) -> _Site:
    from nodeagent.cluster.kinds import NODE, NODE_IMAGE_STATUS  # noqa: PLC0415
    from nodeagent.cluster.site import statuses_by_node  # noqa: PLC0415
    from nodeagent.selectors import parse_selector  # noqa: PLC0415

    parse_selector(selector_text or "")  # a bad selector fails before any request
    nodes, _ = await api.list(NODE)
    statuses, _ = await api.list(NODE_IMAGE_STATUS)
    holdings, unreadable = await _holdings(api)
    return _Site(list(nodes), statuses_by_node(statuses), holdings, unreadable)


async def _holdings(api: KubeApi) -> tuple[dict[str, Holdings], dict[str, str]]:
    """Every node's published holdings; none when the cluster lacks their CRD (404)."""
    from nodeagent.cluster.holdings import object_name, parse_holdings  # noqa: PLC0415
    from nodeagent.cluster.kinds import NODE_IMAGE_HOLDINGS  # noqa: PLC0415

    try:
        objects, _ = await api.list(NODE_IMAGE_HOLDINGS)
    except ApiRequestRejected as exc:
        if "HTTP 404" in exc.message:
            return {}, {}
        raise
    found: dict[str, Holdings] = {}
    unreadable: dict[str, str] = {}
    for obj in objects:
        try:
            held = parse_holdings(obj)
        except PeerHoldingsInvalid as exc:
            unreadable[object_name(obj) or "?"] = exc.message
            continue
        found[held.node] = held
    return found, unreadable


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _say(text: str, *, file: Any = None) -> None:
    print(clip(text, _LINE_CHARS), file=file or sys.stdout)


# ---------------------------------------------------------------- site status


async def _status(config: Config, args: argparse.Namespace) -> int:
    from nodeagent.cluster.site import bundle_view, release_notes, site_views  # noqa: PLC0415

    if args.set_name is not None and args.bundle is None:
        raise ConfigInvalid(
            "site status --set NAME needs --bundle ID: the set is judged per bundle"
        )
    api = _api(config, args)
    try:
        site = await _read(api, args.selector)
    finally:
        await api.close()
    scope = site.scope(args.bundle, args.selector)
    nodes, statuses, held = list(scope.nodes), site.statuses, site.holdings
    stale = _stale_after_s(config, args)
    if args.bundle is not None:
        views = [
            bundle_view(
                nodes, statuses, args.bundle, args.set_name,
                now=_now(), stale_after_s=stale, holdings=held,
            )
        ]  # fmt: skip
    else:
        views = site_views(nodes, statuses, now=_now(), stale_after_s=stale, holdings=held)
    unreadable = {n: why for n, why in site.unreadable.items() if n in nodes}
    notes = release_notes(nodes, statuses)
    if args.json:
        doc = {
            "scope": scope.description,
            "nodes": len(nodes),
            "bundles": [v.to_json() for v in views],
            "releaseNotes": notes,
        }
        output.print_json("site-status", doc | {"holdingsUnreadable": unreadable})
        return 0
    without = [n for n in nodes if n not in statuses]
    _say(f"{len(nodes)} nodes in scope, {len(nodes) - len(without)} reporting")
    _say(scope.description)
    if without:
        _say("no status: " + ", ".join(without))
    for node, why in sorted(unreadable.items()):
        _say(f"holdings unreadable: {node}: {why}")
    if not views:
        _say("no bundle reported by any node in scope")
    for view in views:
        for line in view.lines():
            _say(line)
    for note in notes:
        _say(f"release {note['version']} on {note['node']}: {note['reason']}: {note['message']}")
    return 0


# ---------------------------------------------------------------- site wait


async def _wait(config: Config, args: argparse.Namespace) -> int:
    """Poll until complete (0) or the deadline (75). The API server unreachable at the first
    read exits 69 at once (a wrong server, most likely); later it is retried until the
    deadline, so a blip does not end an hour's wait, and 69 if it is still down then."""
    from nodeagent.cluster.site import bundle_view  # noqa: PLC0415

    api = _api(config, args)
    deadline = time.monotonic() + args.timeout
    stale = _stale_after_s(config, args)
    shown: list[str] = []
    scope = ""
    view: BundleView | None = None
    outage: ApiUnreachable | None = None
    try:
        while True:
            try:
                site = await _read(api, args.selector)
            except ApiUnreachable as exc:
                if view is None:
                    raise
                if outage is None:
                    output.print_error(
                        exc.reason, f"{exc.message}; retrying until the timeout", prefix="warning"
                    )
                outage = exc
            else:
                outage = None
                chosen = site.scope(args.bundle, args.selector)
                scope = chosen.description
                view = bundle_view(
                    list(chosen.nodes), site.statuses, args.bundle, args.set_name,
                    now=_now(), stale_after_s=stale, holdings=site.holdings,
                )  # fmt: skip
                if view.is_complete:
                    return _done(view, args, scope, is_shown=shown[1:2] == [f"  {scope}"])
                shown = _progress(view, scope, shown)
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                if outage is not None:
                    raise outage
                return _timed_out(view, args, scope)
            await asyncio.sleep(min(args.interval, left_s))
    finally:
        await api.close()


def _progress(view: BundleView, scope: str, shown: list[str]) -> list[str]:
    """Print the laggards (and the scope) on stderr when they changed since the last print."""
    lines = view.lines() if view.nodes else [view.summary() + " (no Node in scope)"]
    lines.insert(1, f"  {scope}")
    if lines != shown:
        _say("waiting: " + lines[0], file=sys.stderr)
        for line in lines[1:]:
            _say(line, file=sys.stderr)
    return lines


def _done(view: BundleView, args: argparse.Namespace, scope: str, *, is_shown: bool) -> int:
    """The summary alone on stdout (a pipeline reads it); the scope on stderr, unless the
    last progress lines already said it."""
    if args.json:
        output.print_json("site-wait", view.to_json() | {"scope": scope})
    else:
        _say(view.summary())
    if not is_shown:
        _say(scope, file=sys.stderr)
    return 0


def _timed_out(view: BundleView, args: argparse.Namespace, scope: str) -> int:
    if args.json:
        output.print_json("site-wait", view.to_json() | {"scope": scope})
    empty = "" if view.nodes else " (no Node in scope: check --selector)"
    _say(
        f"error: timed out after {args.timeout:g} s: {view.summary()}{empty}; "
        "what to do: see why each node below lags, then run the wait again",
        file=sys.stderr,
    )
    _say(f"  {scope}", file=sys.stderr)
    for node in view.laggards:
        _say(f"  {node.node}: {node.why()}", file=sys.stderr)
    for line in view.conflict_lines():
        _say(line, file=sys.stderr)
    return EXIT_TIMEOUT
