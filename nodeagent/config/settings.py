"""nodeagent's settings: one frozen dataclass per table of the configuration file, and ``Config``.

Every key is a field whose docstring gives its meaning, unit, default and the reason for
that default: this module is the reference that ``man nodeagent``, the packaged
``config.toml`` and the docs point to. The values are plain data; reading them from
files and checking their ranges is ``nodeagent.config.loading``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from nodeagent.config.mirror import MirrorSettings
from nodeagent.config.monitoring import MetricsSettings
from nodeagent.config.rerooting import reroot, reroot_sections
from nodeagent.config.site import SiteSettings as SiteSettings
from nodeagent.config.upgrade import UpgradeSettings

DEFAULT_CONFIG_PATH = Path("/etc/nodeagent/config.toml")
DROPIN_DIR_NAME = "config.d"
_GIB = 1024**3


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """How to reach CRI-O, and where its configuration lives (``[runtime]``)."""

    endpoint: str = "unix:///var/run/crio/crio.sock"
    """CRI socket, ``unix://`` plus an absolute path. Default: CRI-O's socket on OpenShift."""
    config_file: Path = Path("/etc/crio/crio.conf")
    """CRI-O's main config file (default: CRI-O's). Its ``pinned_images`` are foreign pins that
    nodeagent's pin file must repeat: CRI-O replaces lists instead of merging them."""
    config_dir: Path = Path("/etc/crio/crio.conf.d")
    """The one drop-in directory CRI-O reads, its ``--config-dir`` (default: CRI-O's). The
    persistent pin file goes here; other files here that set ``pinned_images`` are foreign pins."""
    transient_dropin_dir: Path = Path("/run/crio/crio.conf.d")
    """Where the pin file of transient sets is written: tmpfs, gone at reboot like those sets.
    CRI-O reads it only when configured to."""
    dropin_name: str = "99-nodeagent-pinned-images.conf"
    """File name of the pin files, without ``/``. The default sorts after OpenShift's
    ``50-pinned-images``: the last file that sets ``pinned_images`` wins, so ours must."""
    unit: str = "crio.service"
    """systemd unit reloaded over D-Bus after a pin file changed (ExecReload sends SIGHUP)."""
    pid_file: Path | None = None
    """Fallback without systemd: a file holding the PID to send SIGHUP to. ``""`` (the default,
    stored as None) means the unit's MainPID only."""
    reload_timeout_s: float = 60.0
    """Seconds to wait for a reload. Default 60: a reload re-reads the registries configuration
    and re-pins every stored image, slow on a large store.
    Range: greater than 0 and at most 3600 seconds."""
    registries_conf: Path = Path("/etc/containers/registries.conf")
    """The registries configuration CRI-O pulls with; registries marked ``insecure`` there are
    read over plain HTTP by nodeagent's manifest look-ups too (disk admission)."""
    registries_dir: Path = Path("/etc/containers/registries.conf.d")
    """Drop-ins of ``registries_conf``, read in lexical order like containers/image does."""
    registries_d_dir: Path = Path("/etc/containers/registries.d")
    """containers-registries.d(5) of the runtime: where ``use-sigstore-attachments`` is set
    (checked for a bundle's signed images) and the import's drop-in for the loopback mirror
    goes. CRI-O running as root uses ``$HOME/.config/containers/registries.d`` instead when
    that exists (docs/runtime-facts.md)."""
    certs_dirs: tuple[Path, ...] = (Path("/etc/containers/certs.d"), Path("/etc/docker/certs.d"))
    """containers-certs.d(5) directories, in the order they are tried: a registry host's
    ``<dir>/<host[:port]>/`` from the first that has one gives its ``*.crt`` CAs and its
    ``*.cert``/``*.key`` client certificate to every registry request nodeagent makes (look-ups,
    registry sets, ``bundle create``). Default: containers/image's system directories; CRI-O
    running as root reads ``$HOME/.config/containers/certs.d`` before them when it exists
    (docs/runtime-facts.md): list it first where a node has one."""
    call_timeout_s: float = 30.0
    """Deadline in seconds of one short CRI call (version, list, status; pulls are governed by
    ``pull.stall_timeout_s``). Default 30: ListImages of a busy node with many images.
    Range: greater than 0 and at most 3600 seconds."""

    @property
    def persistent_dropin_path(self) -> Path:
        """The link in CRI-O's drop-in directory through which CRI-O reads the pin file."""
        return self.config_dir / self.dropin_name

    @property
    def transient_dropin_path(self) -> Path:
        """The pin file itself, on tmpfs: rebuilt from the ledger at every start."""
        return self.transient_dropin_dir / self.dropin_name


@dataclass(frozen=True, slots=True)
class SpecSettings:
    """Where PinnedImageSet files are read from (``[specs]``)."""

    dirs: tuple[Path, ...] = (
        Path("/etc/nodeagent/pinnedimagesets.d"),
        Path("/run/nodeagent/pinnedimagesets.d"),
    )
    """Directories of PinnedImageSet YAML files, 1 to 16. The first is persistent (its sets
    survive reboots), the others transient (``/run`` by default). A set defined twice is taken
    from the directory listed first."""


@dataclass(frozen=True, slots=True)
class PullSettings:
    """How images are pulled through CRI (``[pull]``)."""

    auth_file: Path = Path("/var/lib/kubelet/config.json")
    """Registry credentials (docker config JSON). Default: the kubelet's pull secret, so
    nodeagent pulls exactly what the node's pods can."""
    concurrency: int = 6
    """Pulls in flight at once, at least 1. Default 6: a pull through CRI-O waits about 23
    round trips to the registry, so over a 50 ms link throughput grows with the pulls in
    flight (4: 22 s, 6: 17 s, 8: 16 s for 50 images), while on a fast link, where CRI-O's
    CPU is the limit, 8 were 6 % slower than 4 (docs/performance.md). From a far registry
    (a round of disk admission's manifest fetches takes 60 ms or more) a sync runs three
    times this, at most 64 (``prepull.pulls_in_flight``). MCD uses 5 workers. Bundle
    imports use at most 4 (see ``bundles_build``). Range: from 1 to 64."""
    attempts: int = 5
    """Tries per image before it is reported failed (transient errors only), at least 1.
    Default 5, as MCD. Range: from 1 to 1000."""
    backoff_initial_s: float = 1.0
    """Seconds before the second try; doubled after each failed try. Default 1, as MCD.
    Range: greater than 0 and at most 3600 seconds."""
    backoff_max_s: float = 60.0
    """Largest delay in seconds between tries, at least ``backoff_initial_s``. Default 60
    (MCD: 10): gentler on a registry that is down for minutes.
    Range: greater than 0 and at most 86400 seconds."""
    shared_layer_min_bytes: int = 16 * 1024**2
    """A layer the runtime lacks, shared by several images and at least this big (compressed),
    is pulled with the first of them alone; the others start when it is done and find it
    stored. Without the wait, every pull in flight downloads it (CRI-O does not share
    downloads between pulls). Default 16MiB: waiting costs about one image's pull time,
    so it pays where ``concurrency - 1`` extra copies take longer than that (measured in
    docs/performance.md: small layers are cheaper to fetch twice). "0" waits for any
    shared layer; a huge size such as "1EiB" never waits. Range: from 0 to 2^63-1 bytes."""
    stall_timeout_s: float = 300.0
    """Seconds without growth of the image filesystem after which a pull is stalled and retried.
    Default 300. There is no overall deadline: a slow but healthy pull of a large set goes on
    (the machine-config-daemon's 2-minute prefetch timeout reports those as Degraded;
    docs/runtime-facts.md). Range: greater than 0 and at most 86400 seconds."""


@dataclass(frozen=True, slots=True)
class DiskSettings:
    """Disk admission before pulling (``[disk]``)."""

    expansion_factor: float = 2.0
    """Bytes on disk per compressed layer byte, to estimate the need from manifests before
    pulling; at least 1. Default 2, as MCD (gzip'd layers expand about 2-3 times).
    Range: from 1 to 100."""
    reserve_bytes: int = 2 * _GIB
    """Bytes that must stay free on the image filesystem after all admitted pulls; a number or
    a size such as ``"2GiB"``. Default 2 GiB. MCD keeps 16 GiB free, a quarter of a 64 GB edge
    disk, which refuses most sets there. The floor only has to cover what the node writes
    besides nodeagent's pulls: the kubelet pulling an application image (a few hundred MB,
    doubled on disk), container logs (rotated at 10 MiB x 5 files per container, about 1 GiB
    for 20 containers) and the journal. On larger filesystems ``reserve_percent`` dominates.
    Range: from 0 to 2^63-1 bytes."""
    reserve_percent: float = 15.0
    """Percent of the filesystem's size that must stay free, 0 to 90; the larger of this and
    ``reserve_bytes`` applies. Default 15: the kubelet evicts pods below 15 % free on the image
    filesystem (``imagefs.available``, OpenShift's default too) and its image GC starts at 85 %
    used, deleting unpinned images, those pulled but not pinned yet included (the pin file is
    written last). Staying above keeps the node out of DiskPressure. Range: from 0 to 90."""


@dataclass(frozen=True, slots=True)
class StateSettings:
    """nodeagent's own persistent state (``[state]``)."""

    dir: Path = Path("/var/lib/nodeagent")
    """Directory for state that must survive restarts and reboots (what was applied, with which
    result). Default: under ``/var/lib``, the unit's ``StateDirectory=``."""
    run_dir: Path = Path("/run/nodeagent")
    """Directory for what lasts until reboot only: the pin file's lock (``pins.lock``, held by
    the daemon, taken by ``render-pins --write``). Default the unit's ``RuntimeDirectory=``."""


KNOWN_MEDIA_FS_TYPES: Final = (
    "btrfs", "erofs", "exfat", "ext2", "ext3", "ext4", "iso9660", "squashfs", "udf", "vfat", "xfs",
)  # fmt: skip
"""Filesystems ``[bundles] media_fs_types`` may name: those whose read-only mount nodeagent
knows how to keep from writing to the medium (``bundles.media.FS_MOUNT_OPTIONS``)."""
KNOWN_MEDIA_BUSES: Final = ("usb", "mmc", "loop", "ata", "scsi", "nvme", "virtio")
"""Buses ``[bundles] media_buses`` may name: what ``bundles.media.media_bus`` tells apart."""


@dataclass(frozen=True, slots=True)
class BundleSettings:
    """Upgrade bundles on removable media (``[bundles]``)."""

    watch_media: bool = True
    """Watch udev for removable media carrying bundles. Default true; false on nodes that
    only take bundles by hand (``nodeagent bundle import``)."""
    label_pattern: str = "NODEAGENT*"
    """Glob on the filesystem label of block devices that may carry a bundle. Default
    ``NODEAGENT*``: a factory labels its sticks so; other media are never touched."""
    media_fs_types: tuple[str, ...] = ("ext4", "vfat")
    """Filesystems (blkid's names, as ``udevadm info`` shows ``ID_FS_TYPE``) nodeagent mounts
    from a labelled medium; another is refused before anything is mounted (journal
    ``bundle_media_refused``), so its kernel driver never reads the stick. Default ext4 and
    vfat: what a Linux workstation and any laptop write (vfat holds files up to 4 GiB - 1).
    Each one added is more kernel code a crafted stick can reach. Range: 1 to 11 distinct
    names among ext4, ext3, ext2, xfs, btrfs, vfat, exfat, iso9660, udf, squashfs, erofs."""
    media_buses: tuple[str, ...] = ("usb",)
    """Where a labelled medium must be plugged in to be mounted: ``usb`` (sticks, USB card
    readers and USB SSDs, whatever their ``removable`` flag), ``mmc`` (a built-in SD slot;
    on many boards the internal eMMC too), ``loop`` (loop devices: tests), ``ata``, ``scsi``,
    ``nvme``, ``virtio`` (virtual disks). Another is refused before anything is mounted.
    Default usb. Range: 1 to 7 distinct names among those."""
    trusted_keys_dir: Path = Path("/etc/nodeagent/trusted-keys.d")
    """Public keys whose signatures make a bundle authentic: minisign's (``*.pub``) and ECDSA
    P-256 or P-384 ones (``*.pem``, PEM SubjectPublicKeyInfo; decision 0075). At most 256
    files of 4 KiB each; a malformed one is ``SigningKeyMalformed``."""
    fips_switch: Path = Path("/proc/sys/crypto/fips_enabled")
    """The kernel's FIPS switch: where it reads 1, a bundle needs its ECDSA signature
    (``bundle.json.ecdsa-sig``) and minisign's is not looked at (decision 0075). Default
    ``/proc/sys/crypto/fips_enabled``; another path only for tests."""
    image_keys_dir: Path = Path("/etc/nodeagent/image-keys.d")
    """Agent image keys: Ed25519 public keys (``*.pem``) that sign nodeagent's own image
    (its statement, ``tools/build_image.py --sign-key``). Only the container variant's
    self-update reads them: a bundle's ``agentImage`` runs only when one of these signed it,
    whatever key signed the bundle (decisions 0071, 0074). Separate from
    ``trusted_keys_dir`` on purpose. Default ``/etc/nodeagent/image-keys.d`` (the
    MachineConfig installs it); at most 64 keys of 16 KiB each are read."""
    agent_image_dir: Path = Path("/var/lib/nodeagent/image")
    """The container variant's image state, shared with the host's scripts
    (systemd/container/): ``sequence`` (the newest image accepted), ``rejected`` (digests
    rolled back), and ``incoming/`` where the daemon stages a bundle's newer nodeagent image
    for ``nodeagent-image-load --incoming``. Default ``/var/lib/nodeagent/image``, where
    those scripts look; with the RPM nothing is written there."""
    media_dir: Path = Path("/run/nodeagent/media")
    """Where media are mounted read-only (nosuid, nodev, noexec) while being imported."""
    mirror_dropin_name: str = "99-nodeagent-bundle-mirror.conf"
    """registries.conf drop-in (in ``runtime.registries_dir``) that points the runtime at the
    bundle served on loopback during an import; removed afterwards."""
    session_socket: Path | None = Path("/run/nodeagent/session.sock")
    """Where the daemon asks for a mirror session's loopback server (an import's, a
    restore's): ``nodeagent-session.socket``, which systemd answers with one ``nodeagent
    serve-session`` process per session, run as the unprivileged ``nodeagent-peer`` user
    with no capability (decision 0064). ``""``: the daemon starts that process itself, as
    its own user (root under systemd): for development and the test harness only;
    ``check-config`` says so. Default ``/run/nodeagent/session.sock``."""


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """The node's verified image store (``[store]``, docs/store.md)."""

    path: Path | None = None
    """Directory of the store, an OCI image layout outside the runtime's storage so that a
    runtime wipe leaves it alone. ``""`` (the default, stored as None): ``<state.dir>/store``."""
    max_bytes: int = 0
    """Size cap of the store's blobs: a number or a size such as ``"40GiB"``. A copy that would
    pass it is refused before its first byte (``StoreFull``). ``0`` (default): no cap of its
    own; the filesystem's free space and ``[disk]`` reserve still apply.
    Range: from 0 to 2^63-1 bytes."""
    max_percent: float = 0.0
    """Size cap as a percentage of the store filesystem's size, 0 to 100; with ``max_bytes``
    the smaller applies. ``0`` (default): none. Range: from 0 to 100."""
    gc_grace_s: float = 3600.0
    """Seconds a blob nothing kept refers to stays before it is removed, at least 0. Default one
    hour: a bundle being imported, or a set re-added soon after, finds its blobs still there.
    Range: from 0 to 2592000 seconds."""
    keep_newest_per_channel: bool = True
    """Keep the newest bundle of each signing key and channel even when none of its sets is
    pinned any more (for peers, and to re-pin without the stick). Default true."""
    registry_sets: bool = False
    """Also keep the images of sets loaded from specs (not from a bundle) in the store: their
    blobs are fetched once from the registry into the store and pulled into the runtime from
    there, so they can be restored offline too. Costs a second copy of their compressed
    layers on the store's filesystem. A fetch the store refuses (``StoreFull``, no space) or
    that fails falls back to the registry pull. Default false: bundle content only."""


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """Cluster mode (``[cluster]``): PinnedImageSets from the Kubernetes API, status back to it."""

    enabled: bool = False
    """Read sets from the API server and report to it. Default false: a node without a cluster
    (or before it joins one) works from local spec files alone."""
    kubeconfig: Path = Path("/var/lib/kubelet/kubeconfig")
    """Credentials: the node's own identity (default: the kubelet's kubeconfig, whose client
    certificate is ``system:node:<name>``). The RBAC and admission policy in ``deploy/`` let that
    identity write only its own status object."""
    node_name: str = ""
    """This node's name in the cluster. ``""`` (default): the kubelet's own name for the node:
    the CN ``system:node:<name>`` of ``kubelet_client_cert``, else ``KUBELET_NODE_NAME``
    (the kubelet's ``--hostname-override``) from ``kubelet_env_files``, else the whole host
    name lower-cased. The journal says which was used (``node_name_chosen``)."""
    kubelet_client_cert: Path = Path("/var/lib/kubelet/pki/kubelet-client-current.pem")
    """The kubelet's client certificate (PEM), read for its CN ``system:node:<name>`` when
    ``node_name`` is not set. Default the file the kubelet rotates on OpenShift and kubeadm."""
    kubelet_env_files: tuple[Path, ...] = (
        Path("/etc/kubernetes/kubelet-env"),
        Path("/etc/kubernetes/node.env"),
    )
    """Environment files of ``kubelet.service`` whose ``KUBELET_NODE_NAME`` is its
    ``--hostname-override`` on OpenShift, in the unit's order (the last setting wins).
    Default OpenShift's two (node.env is written on AWS)."""
    set_selector: str = ""
    """Without MachineConfigPools: the label selector (``kubectl -l`` syntax) a PinnedImageSet
    must match to apply to this node. ``""`` (default): every set. With pools, OpenShift's
    association decides and this is ignored."""
    status_interval_s: float = 5.0
    """A milestone (a set pinned or failed, a condition changed) is written at most this many
    seconds after the previous write (default 5). Range: greater than 0 and at most 3600 seconds."""
    progress_interval_s: float = 30.0
    """Pull progress alone (counts, bytes, images in flight) is written at most once per this
    many seconds (default 30: with 500 nodes pulling, 60 s of pulls cost the API server
    2 writes per node instead of 12; docs/performance.md).
    Range: greater than 0 and at most 3600 seconds."""
    heartbeat_s: float = 60.0
    """While pulls run, the status is written at least this often, so a slow pull shows as
    alive (default 60). Range: greater than 0 and at most 3600 seconds."""
    events: bool = True
    """Post Kubernetes Events on the Node when a set is pinned or fails (default true)."""
    event_namespace: str = "default"
    """Namespace of those Events (Node events live in ``default``, as the kubelet's do)."""
    api_sets: str = "auto"
    """Who pins the API's PinnedImageSets on this node (decision 0044): ``auto`` (default: the
    machine-config-daemon where the cluster has MachineConfigPools and the Node carries its
    ``machineconfiguration.openshift.io/currentConfig`` annotation, nodeagent elsewhere),
    ``nodeagent`` (take them over) or ``mcd`` (leave them to it). Bundles, local spec files
    and nodeagent's own status object are nodeagent's in every mode."""
    machine_config_node: bool = False
    """Also mirror per-set generations and the ``PinnedImageSets*`` conditions into the node's
    OpenShift MachineConfigNode status, as the machine-config-daemon writes them. Only while
    nodeagent owns the API sets (``api_sets``): two writers of one condition fight.
    Default false."""
    request_timeout_s: float = 30.0
    """Timeout of one API request (watches excepted).
    Range: greater than 0 and at most 3600 seconds."""
    control_plane_pull_pause_s: float = 1.0
    """On a control-plane Node (label ``node-role.kubernetes.io/master`` or
    ``node-role.kubernetes.io/control-plane``) registry pulls run one at a time, with this
    many seconds between two of them, to spare etcd's disk. Default 1, the
    machine-config-daemon's pause; 0: one at a time without a pause. Restores from the
    node's store and bundle imports are not paced. Range: from 0 to 600 seconds."""


@dataclass(frozen=True, slots=True)
class OfflineSettings:
    """The offline-readiness drill (``[offline]``, docs/offline.md): what would break here if
    the registry vanished. ``nodeagent check-offline`` reads the same settings."""

    drill: bool = True
    """Run the drill in the daemon and publish the ``OfflineReady`` condition. Default true."""
    interval_s: float = 600.0
    """Seconds between two runs of the drill (it also runs after each sync and bundle
    import). Default 600. Range: from 10 to 86400 seconds."""
    kubelet_config_files: tuple[Path, ...] = (
        Path("/etc/kubernetes/kubelet.conf"),
        Path("/var/lib/kubelet/config.yaml"),
    )
    """The kubelet's configuration file: the first that exists is read (OpenShift's, then
    kubeadm's). Default both, in that order."""
    static_pod_dir: Path = Path("/etc/kubernetes/manifests")
    """The kubelet's ``staticPodPath``: without the API, the pods checked are the static
    pods of these manifests. Default /etc/kubernetes/manifests."""
    signature_policy: Path = Path("/etc/containers/policy.json")
    """containers-policy.json(5) as CRI-O reads it (its ``signature_policy``). Default
    /etc/containers/policy.json."""
    pod_events: bool = True
    """Cluster mode: one warning Event per pod that pulls ``Always`` (once per pod).
    Default true."""


@dataclass(frozen=True, slots=True)
class NodeOsSettings:
    """The node's OS image in the status (``[node_os]``, docs/operations.md, "The node's OS
    image"): os-release and, on image-based hosts, the booted image and its digest."""

    report: bool = True
    """Read and report the OS image (``status.osImage``). Default true."""
    os_release: Path = Path("/etc/os-release")
    """os-release(5): ``ID``, ``VERSION_ID``, ``VERSION``. Default /etc/os-release."""
    bootc: Path = Path("/usr/bin/bootc")
    """``bootc status --format json`` is run from here when the file exists. Default
    /usr/bin/bootc."""
    rpm_ostree: Path = Path("/usr/bin/rpm-ostree")
    """``rpm-ostree status --json`` is run from here when the file exists (RHCOS). Default
    /usr/bin/rpm-ostree."""
    timeout_s: float = 30.0
    """Seconds a tool may take before it is stopped and its part left out. Default 30.
    Range: greater than 0 and at most 600 seconds."""
    interval_s: float = 3600.0
    """Seconds between two reads (the booted image changes only with a reboot; a read that
    failed is tried again). Default 3600. Range: from 60 to 86400 seconds."""


@dataclass(frozen=True, slots=True)
class LogSettings:
    """Logging (``[log]``)."""

    level: str = "info"
    """Lowest level logged: debug, info, warning or error. Default info: each transition once."""


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration, one frozen value."""

    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    """``[runtime]``: the CRI socket and CRI-O's configuration files."""
    specs: SpecSettings = field(default_factory=SpecSettings)
    """``[specs]``: where PinnedImageSets come from."""
    pull: PullSettings = field(default_factory=PullSettings)
    """``[pull]``: concurrency, retries and stall detection of pulls."""
    disk: DiskSettings = field(default_factory=DiskSettings)
    """``[disk]``: disk admission before pulls."""
    state: StateSettings = field(default_factory=StateSettings)
    """``[state]``: nodeagent's persistent state."""
    bundles: BundleSettings = field(default_factory=BundleSettings)
    """``[bundles]``: upgrade bundles on removable media."""
    store: StoreSettings = field(default_factory=StoreSettings)
    """``[store]``: the node's verified image store."""
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    """``[cluster]``: PinnedImageSets from the Kubernetes API and per-node status."""
    site: SiteSettings = field(default_factory=SiteSettings)
    """``[site]``: serving the store to peers and fetching bundles from them."""
    mirror: MirrorSettings = field(default_factory=MirrorSettings)
    """``[mirror]``: the node mirror and its registries.conf drop-in (``config.mirror``)."""
    offline: OfflineSettings = field(default_factory=OfflineSettings)
    """``[offline]``."""
    node_os: NodeOsSettings = field(default_factory=NodeOsSettings)
    """``[node_os]``."""
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    """``[metrics]``: the OpenMetrics endpoint (``config.monitoring``)."""
    upgrade: UpgradeSettings = field(default_factory=UpgradeSettings)
    """``[upgrade]``: release retirement and the one-touch upgrade (``config.upgrade``)."""
    log: LogSettings = field(default_factory=LogSettings)
    """``[log]``: logging."""
    source: Path = DEFAULT_CONFIG_PATH
    """The main file (re-rooted); it need not exist."""
    dropin_dir: Path = DEFAULT_CONFIG_PATH.parent / DROPIN_DIR_NAME
    """The drop-in directory next to the main file (re-rooted); it need not exist."""
    files: tuple[Path, ...] = ()
    """The files actually read, in the order they were applied."""

    @classmethod
    def default(cls, root: Path | None = None) -> Config:
        """The built-in defaults, every host path re-rooted under ``root`` when given."""
        source = reroot(DEFAULT_CONFIG_PATH, root)
        return reroot_sections(cls(source=source, dropin_dir=source.parent / DROPIN_DIR_NAME), root)

    @property
    def store_dir(self) -> Path:
        """The image store's directory: ``[store] path``, else ``<state.dir>/store``."""
        return self.store.path or self.state.dir / "store"

    @property
    def specs_persistent_dir(self) -> Path:
        """The spec directory whose sets survive reboots (the first of ``specs.dirs``)."""
        return self.specs.dirs[0]

    @property
    def specs_transient_dirs(self) -> tuple[Path, ...]:
        """The spec directories whose sets are gone after a reboot (the rest)."""
        return self.specs.dirs[1:]

    @property
    def cluster_specs_dir(self) -> Path:
        """Where the sets the cluster assigns to this node are kept (persistent: they are the
        last known specs while the API server is unreachable, and after a reboot)."""
        return self.state.dir / "cluster" / "pinnedimagesets.d"

    def spec_dirs(self) -> tuple[tuple[Path, bool], ...]:
        """``(directory, is_persistent)`` pairs in priority order, for ``load_spec_dirs``."""
        dirs = tuple((path, index == 0) for index, path in enumerate(self.specs.dirs))
        if self.cluster.enabled:
            dirs += ((self.cluster_specs_dir, True),)
        return dirs
