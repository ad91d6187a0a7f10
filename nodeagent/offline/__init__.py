"""The offline-readiness drill: "if the registry vanished now, what would break here?".

``nodeagent check-offline`` and the daemon's periodic drill run the same checks
(docs/offline.md). Modules: ``findings`` (a finding: reason code, clipped message, what to
do; the report and its ``OfflineReady`` condition), ``facts`` (what the checks read, as
plain values), ``parsing`` (pods, the kubelet's configuration, the signature policy and
CRI-O's pause image, from hostile bytes to facts), ``checks`` (one pure function per
finding family, listed in ``CHECKS``), ``drill`` (the daemon's service: when to run,
the condition, the per-pod Events, the journal).

Host interfaces this feature needs (implemented in ``nodeagent.adapters.offline``):

- the CRI socket: ``ListImages`` (present, ``pinned``) and ``ListContainers`` (the images
  running containers use);
- files: CRI-O's configuration (``pause_image``), the kubelet's configuration file
  (``imagePullCredentialsVerificationPolicy``), the static pod directory, the signature
  policy (``/etc/containers/policy.json``), the node's image store (``store/``);
- cluster mode only: the API server, to list this node's pods (field selector
  ``spec.nodeName``) and to create a warning Event per pod that pulls ``Always``.
"""
