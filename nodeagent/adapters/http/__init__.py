"""HTTP on aiohttp: the one adapter that imports it (docs/decisions/0027).

* ``mirror``: the loopback mirror CRI-O pulls a bundle through while it is imported
  (``BundleServer``, plain HTTP on 127.0.0.1);
* ``peer``: the store served read-only to the site's peers over mutual TLS (docs/site.md);
* the parts both use: ``listener`` (the aiohttp low-level server with bounded request
  heads and a first-request deadline), ``content`` (manifests and blobs by digest from an
  allow-list), ``streamer`` (a blob hashed as it is sent, its last chunk held back until
  the digest matched).

Host interfaces: TCP sockets, files beneath one root opened without following links
(``nodeagent.adapters.bundles.tree.BundleDir``), and for the peer server the TLS
certificate, key and CA files of ``[site]``. Nothing here is imported until a server
starts: importing aiohttp costs about 9 MiB of resident memory.
"""
