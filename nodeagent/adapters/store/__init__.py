"""The node's image store on disk (``nodeagent.store`` holds its rules; docs/store.md).

``blobs``: blob files, written crash-safe and read verified; ``records``: the layout files,
bundle records and removal marks; ``copier``: a bundle's blobs from a medium into the
store; ``keeper``: what is kept, removal of the rest, ``verify``; ``source``: the store as
the loopback bundle server's blob source.
"""
