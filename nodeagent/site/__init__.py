"""The site: sharing verified bundles between a site's nodes (docs/site.md).

Pure rules only: which bundles a node follows, what its store holds as peers see it,
which peer to ask for which blob. The peer server and client are adapters
(``nodeagent.adapters``); the daemon wires them.
"""
