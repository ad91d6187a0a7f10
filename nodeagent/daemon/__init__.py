"""The composition root: builds adapters and services, runs them guarded, stops in stages.

- ``root``: ``nodeagent run`` (signals, start order, READY=1, exit code).
- ``wiring``: every adapter and service, built once and handed to each other.
- ``policies``: the policies services run under, built once from the configuration.
- ``supervisor``: every task guarded; critical ones stop the daemon, optional ones restart.
- ``bundles``, ``cluster``: the importer's and cluster mode's adapters, loaded only when on.

Only this package and ``nodeagent.cli`` import ``nodeagent.adapters``; services see
adapters through the ports they were given.
"""
