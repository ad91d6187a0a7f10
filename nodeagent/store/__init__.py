"""The node's verified image store: bundle content kept on the node, outside the runtime.

A content-addressed OCI image layout (``oci-layout``, ``index.json``,
``blobs/sha256/<hex>``) that skopeo and umoci read as ``oci:<dir>``, with each accepted
bundle's signed ``bundle.json``, its signature and a record of what it carried in
``bundles/<bundle-id>/`` (with ``[store] registry_sets``, each registry set's record in
``sets/<set-name>/``). docs/store.md describes the layout, the crash-safety of blob
writes, the keep and removal rules and the commands.

Pure parts only, in this package:

- ``layout``: names and paths inside the store, the records (``BundleRecord``) and the
  ``index.json`` they render to;
- ``keeping``: which bundles are kept and why, which blobs nothing kept refers to, when
  those are removed (a grace period, from a recorded mark: no sleeping), the size cap;

Host interfaces this feature needs (implemented in ``nodeagent.adapters.store``, wired by
``nodeagent.daemon`` and ``nodeagent.cli``):

- the store directory (``[store] path``, default ``<state.dir>/store``): files created,
  fsynced and renamed there, directories fsynced, ``flock`` on partial blobs;
- ``statvfs`` of the store's filesystem (admission, ``[store] max_percent``);
- the registry, through the daemon's registry client, for registry sets;
- reading a mounted bundle medium (``adapters.bundles.tree.BundleDir``) and, where the
  filesystem answers it, ``FS_IOC_FIEMAP`` to read its blobs in on-disk order.
"""
