"""Stand-ins for nodeagent's peers, for unit and service tests.

crio.py: CRI-O's image service and its drop-in files, in memory. systemd_manager.py:
systemd's Manager on D-Bus. Each has a contract in tests/service/ (crio_pins_contract.py,
systemd_jobs_contract.py) whose assertions run against the stand-in and the real peer.
clock.py: virtual time and an inline executor. reloader.py: a ``pins.Reloader`` that makes
the in-memory CRI-O re-read its files.
"""
