"""``nodeagent check-offline [--json]``: if the registry vanished now, what would break here?

Runs the offline drill's checks once (docs/offline.md) and prints each finding: its
reason code, what was found, what to do. Exit codes: 0 offline-ready; 1 not ready (at
least one finding); 75 when the only findings are checks that could not look
(``OfflineCheckIncomplete``: the runtime down, a file unreadable, the API unreachable);
an error's own code (e.g. 78 for a bad configuration). In cluster mode the pods are this
node's pods from the API server, else the static pods of ``[offline] static_pod_dir``.
"""

from __future__ import annotations

import asyncio
from typing import Final

from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.offline import HostFacts, api_pods
from nodeagent.cli import output
from nodeagent.config import Config
from nodeagent.offline import findings as f
from nodeagent.offline.checks import run_checks
from nodeagent.offline.findings import OfflineReport
from nodeagent.strict import clip

EXIT_READY: Final = 0
EXIT_NOT_READY: Final = 1
EXIT_INCOMPLETE: Final = 75  # EX_TEMPFAIL: look again when what was missing answers


def exit_code(report: OfflineReport) -> int:
    if report.is_ready:
        return EXIT_READY
    if all(item.reason == f.CHECK_INCOMPLETE for item in report.findings):
        return EXIT_INCOMPLETE
    return EXIT_NOT_READY


async def check(config: Config) -> OfflineReport:
    async with CriClient(config.runtime.endpoint, timeout_s=config.runtime.call_timeout_s) as cri:
        if not config.cluster.enabled:
            return run_checks(await HostFacts(config, cri).gather())
        from nodeagent.adapters.kube import KubeApi  # noqa: PLC0415  (lightkube: cluster mode)
        from nodeagent.adapters.kubelet_identity import with_node_name  # noqa: PLC0415
        from nodeagent.cluster.tasks import node_name  # noqa: PLC0415

        config = with_node_name(config)
        cluster = config.cluster
        api = KubeApi(
            cluster.kubeconfig, timeout_s=cluster.request_timeout_s, field_manager="nodeagent"
        )
        try:
            facts = HostFacts(config, cri, pods=api_pods(api, node_name(config)))
            return run_checks(await facts.gather())
        finally:
            await api.close()


def print_report(report: OfflineReport) -> None:
    if report.is_ready:
        print(f"offline-ready: {len(report.checks)} checks passed ({', '.join(report.checks)})")
        return
    incomplete = [i for i in report.findings if i.reason == f.CHECK_INCOMPLETE]
    if len(incomplete) == len(report.findings):
        print(
            f"COULD NOT CHECK: {len(incomplete)} check(s) could not look, so whether this "
            "node is offline-ready is unknown; run this again once what they name answers"
        )
    else:
        print(f"NOT offline-ready: {len(report.findings)} finding(s)")
    for item in report.findings:
        print(clip(f"{item.reason}: {item.message}", 2000))
        print(f"  what to do: {item.remedy}")


def cmd_check_offline(config: Config, as_json: bool) -> int:
    report = asyncio.run(check(config))
    if as_json:
        output.print_json("check-offline", report.to_json())
    else:
        print_report(report)
    return exit_code(report)
