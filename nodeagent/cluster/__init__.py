"""Cluster mode: PinnedImageSets from the API server in, the node's status object out.

Modules: ``tasks`` (the sets-in task ``ClusterSpecs``, and what both tasks share),
``reporter`` (the status-out task ``StatusReporter``),
``objects`` (the status object and Events, as pure builders), ``machine_config_node``
(the MachineConfigNode mirror, pure), ``ownership`` (who pins the API's sets: nodeagent or
the machine-config-daemon, decision 0044), ``site`` (the site view of ``nodeagent site
status | wait``: every Node's standing for a bundle, pure), ``placement`` (which sets
apply to this node: MachineConfigPools or a label selector), ``pools`` (a node's pools as
the machine-config-operator decides them), ``identity`` (the node's name from the
kubelet's sources), ``readiness`` (whether registry pulls may start, and their pace, from
the Node), ``kinds`` (the resource kinds used) and ``api`` (the ports). Around an
OpenShift upgrade (decisions 0067, 0068): ``rollout`` (whether an upgrade finished on every
pool, pure), ``retirement`` (which release bundles to unpin, pure) and its task
``retiring``; ``one_touch`` (whether to start the upgrade, pure) and its task ``starting``.

Host interfaces this feature needs (implemented in ``nodeagent.adapters``):

- the Kubernetes API server, with the node's own credentials (a kubeconfig): list and
  watch Nodes, MachineConfigPools and PinnedImageSets; server-side apply of the node's
  NodeImageStatus and its MachineConfigNode status; create Events (``adapters.kube``);
- a directory it owns, ``Config.cluster_specs_dir``, where the assigned sets are kept as
  spec files (``adapters.files.mirror_directory``): the daemon's inotify watch on it
  starts a sync, so the pin path does not know where a set came from;
- the kubelet's client certificate and its unit's environment files, read once at start
  for the node's name (``adapters.kubelet_identity``).

Loaded only when ``[cluster] enabled`` (or by a ``nodeagent site`` command): a standalone
node never imports it.
"""
