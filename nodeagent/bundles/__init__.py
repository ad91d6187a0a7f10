"""Upgrade bundles: signed OCI content carried on removable media to a node with no registry.

Flow: a medium is plugged in -> ``imports`` mounts it read-only -> ``importer`` checks
the signature (``minisign``), the signed manifest and the tree (``manifest``), that the
bundle's target includes this node (``target``) and that
every image is complete for this node (``content``), admits it against the disk,
serves it on loopback and points the runtime at it with a registries.conf mirror
(``mirror``), pulls every missing image through CRI, then writes the bundle's
PinnedImageSets where the pin path reads them. ``media`` decides which
udev events are bundle media. The format is docs/bundle-format.md. ``ecdsa_signature``
verifies the FIPS-approved ECDSA signature of a manifest and combines it with minisign's
(decision 0075); imports do not read it yet.

Host interfaces this feature needs (implemented in ``nodeagent.adapters``, wired by
``nodeagent.daemon``):

- udev over netlink, for block devices with a filesystem and a matching label
  (``adapters.bundles.udev``, pyudev; only while ``[bundles] watch_media``);
- mount(2)/umount2(2), read-only, nosuid, nodev, noexec, in ``[bundles] media_dir``
  (``adapters.bundles.mount``; needs CAP_SYS_ADMIN);
- reading the medium's files (``adapters.bundles.tree``) and serving its blobs on a
  loopback TCP port (``adapters.http.mirror``);
- a registries.conf drop-in in ``[runtime] registries_dir`` and a runtime reload
  (``adapters.bundles.mirror``, ``adapters.systemd``);
- the CRI image service (``adapters.cri``), the spec directories
  (``adapters.bundles.intake``) and the state directory (``adapters.files``);
- the trusted public keys in ``[bundles] trusted_keys_dir``.
"""
