"""OCI registries over HTTPS or plain HTTP: manifests for disk sizing, blobs for ``bundle
create``; token and basic auth; a cache of manifests by digest. Standard library only
(docs/decisions/0001-stdlib-for-registry-and-inotify.md)."""
