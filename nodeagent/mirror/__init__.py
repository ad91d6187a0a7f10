"""The node mirror's rules, pure (docs/mirror.md, decision 0057).

``routes``: which request names what (bounded paths, only the repositories the store holds);
``credentials``: the Basic credential a client must present for registry-set content;
``misses``: digests asked for that the store lacks, counted and logged at most once a minute;
``complete``: an image manifest is answered only when every blob it names can be served.
The server is ``nodeagent.adapters.http.node_mirror``.
"""
