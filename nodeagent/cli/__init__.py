"""The ``nodeagent`` command line: ``main`` (parser, exit codes, the node commands) and
``bundle`` (``bundle create | verify | import``). Like the daemon, the CLI may build
adapters itself; everything it decides comes from the feature packages."""
