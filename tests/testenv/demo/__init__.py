"""``make demo``: nodeagent's story on this machine, every part real, no cluster needed.

``python -m tests.testenv.demo`` prepares the test environment (``tests/testenv/__main__.py``,
cached after the first run), then tells, with the daemon's journal lines:

a. a set pinned from a private registry (``node.py``);
b. a signed bundle on a loop-device stick, the registry stopped: verified, copied into the
   node store, "you may remove the stick", pinned (``node.py``);
c. a power cut that wipes CRI-O's storage: the images restored from the node store, with no
   registry (``node.py``);
d. three nodes in network namespaces pinned from one stick (``site.py``);
e. ``nodeagent status``, a metrics scrape and where to read more (``wrapup.py``).

Everything lives in a temp dir removed at the end. ``--skip-site`` leaves d out; ``--only
node`` or ``--only site`` runs one half. ``tests/integration/testenv/test_demo.py`` runs
both halves and checks their milestones.
"""
