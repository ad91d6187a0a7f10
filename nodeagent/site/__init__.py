"""The site: sharing verified bundles between a site's nodes (docs/site.md).

Pure rules first: which bundles a node follows, what its store holds as peers see it,
which peer to ask for which blob. Modules: ``discovery`` (what this node publishes, the
merged peer view, the ``PeerDirectory`` port the fetcher reads), ``publishing`` (the
cluster-mode tasks: the holdings publisher and the peer watcher, decision 0029),
``offers`` (which signed manifests to look at, in which order, pure), ``standing`` (what
this node measured of its peers: demotion, rates; the bounded ``Lru``, pure), ``fetching``
(which blob from which peer, pure), ``asking`` (the static peers' holdings, each peer on
its own), ``transfer`` (one bundle's blobs from the peers into the store), ``imports``
(fetched bundles on their way to the import) and ``fetcher`` (the follow loop's service).
A peer is never trusted (docs/decisions/0053).

Host interfaces this feature needs (implemented in ``nodeagent.adapters``):

- the Kubernetes API server with the node's own identity: list and watch every
  NodeImageHoldings, server-side apply of the node's own (``adapters.kube``, through
  ``cluster.api.KubeApi``);
- the node's image store, read without its lock: records, stored blobs, each bundle's
  signed ``bundle.json`` (``adapters.store.holdings``);
- the peer server and client (HTTPS with mutual TLS) are adapters too; the daemon wires
  them (``adapters.http.peer``, ``adapters.http.client``);
- the store as the fetcher writes it: verify a signed manifest with this node's keys,
  admit, write the manifest, fill blobs verified by digest, write the record
  (``adapters.store.fetched``); the importer's ``import_stored`` for the import.
"""
