"""Stand-ins for nodeagent's peers, for unit and service tests.

crio.py: CRI-O's image service and its config files, in memory. systemd_manager.py:
systemd's Manager on D-Bus, whose contract (tests/service/systemd_jobs_contract.py) runs
against the stand-in and the real systemd. clock.py: virtual time and an inline executor.
reloader.py: a ``pins.Reloader`` that makes the in-memory CRI-O re-read its files.
"""
