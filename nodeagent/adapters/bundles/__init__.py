"""The bundle feature's host side: ``udev`` (media events), ``mount`` (read-only mounts),
``tree`` (reading and checking a bundle directory), ``server`` (the loopback OCI server),
``mirror`` (the registries.conf drop-in), ``intake`` (checks before import and the spec
directories), ``writer`` (``bundle create``: fetching images and writing a bundle)."""
