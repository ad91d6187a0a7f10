"""journald entries: stable MESSAGE_IDs for what a technician cares about, and structured fields.

Pure: builds the field list of one entry and serializes it in journald's native
protocol. ``adapters/journald.py`` sends it; ``systemd/nodeagent.catalog`` explains each
MESSAGE_ID (``journalctl -x -u nodeagent``). Filter with e.g.
``journalctl NODEAGENT_SET=line-3`` or ``journalctl NODEAGENT_REASON=InsufficientDiskSpace``.
Every event logged at warning level or above has an entry (``tests/unit/test_journal_catalog``),
and its line leads with the entry's Subject (``SUMMARIES``), a sentence for a technician.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Final

MESSAGE_IDS: Final[Mapping[str, str]] = {
    "agent_image_refused": "79de2889ab1d4d4697b57cd296245765",
    "agent_image_stage_failed": "7bd4700c44504935b1a49a8d07d72353",
    "agent_image_staged": "4e5ab2d861964e30bbf1a59d9c3ea2e8",
    "bundle_media_detected": "2bef3c816d034df1948ae136b5af10b6",
    "bundle_media_refused": "f1f0a02dc1544c24a780905f9af92eb9",
    "udev_not_running": "24d2f310b36b43ffa12abff42eb685b3",
    "udev_events_lost": "f624a65bd1af4ef080238addadc4c9e4",
    "media_watch_failed": "34cdc17ff5d949809609e54fab6cad6d",
    "bundle_verified": "cf34c67bb85f4cb299fc54349e55fbb7",
    "bundle_progressed": "e528376eb6604c2a8841ddd464ec4608",
    "bundle_stored": "f97c41a4f6ed49019633b3641de4416b",
    "bundle_rejected": "3bb42212bdcd4e10bd895d59597a68a7",
    "bundle_blob_rejected": "0cc2c9cd4d504ed3a6e4f3da1b62aeb5",
    "bundle_imported": "d95642eae4464b609dd352a0a3e4f85a",
    "bundle_signatures_unread": "166495dee8864b099dabf022f51070d2",
    "bundle_interrupted": "7f26e153ace44e4f950bf9d94fd07b0c",
    "bundle_rollback_allowed": "f21af989da854a4ebfdc9da762d2fda9",
    "rollback_marks_not_written": "639530cefe6c4f4e9f46568bc2952e84",
    "bundle_manifest_unverified": "28ab66c4f86d4514ab13091aeeb6ec75",
    "bundle_expiry_ignored": "bcccb3cc6c0043a9b60ad1def35b2dd2",
    "release_not_an_upgrade": "5d0f3b1e9a7c4e2b8f6a1c3d7e9b2a40",
    "upgrade_target_not_pinned": "8c4e2a6f1b3d4f7a9e5c0b2d6a8f1e37",
    "cluster_version_invalid": "e1a7c3f5b9d24e6a8c0f2b4d6e8a1c53",
    "bundle_target_ignored": "07048a4cf05d46439452086814343ca7",
    "set_pinned": "7df08b85c4b34afa83dbe406526c96c7",
    "disk_refused": "b84a77b14e54466a992b99b0cc636a10",
    "pins_not_effective": "2ec2615e533346d2a372262a16879e4b",
    "runtime_config_invalid": "e33a66d4cb814e7f9cb0809b8bd09fe7",
    "sync_postponed": "a96346cdafca4ee1ba4c2888ff890552",
    "api_unreachable": "0275a7867ead41dea72a6e1aafd530c3",
    "status_write_failed": "0f57fa37deb843fc8a3527dd5595aff9",
    "api_watch_failed": "87a6594a5d4e40ab8cbf9eb4eccb0071",
    "node_labels_unknown": "6aebcf9049d549fe8ea32acfbb302903",
    "node_os_source_failed": "35ed386142a641d68ee5da86fb2b4551",
    "node_not_found": "59ebbd948155432d865fbdc0872a357c",
    "pool_membership_invalid": "277300047f574462a0bd785784449380",
    "pool_ignored": "9dff97a91bcf45b3b11f0263abb3e169",
    "state_file_damaged": "6094319f540a4e069592a6ec72fb37da",
    "watch_queue_overflowed": "82454b9a0f234ab7bcde26a83d5f72e2",
    "status_not_saved": "88f5e84e9ab545e8ab4cc44245db7437",
    "state_not_saved": "9b5199d76cea438aa0b10ebdb3b76804",
    "state_copy_not_saved": "fec20f2a43b24fa1be4982345741b0b4",
    "state_file_not_moved": "0d6c6512326c49c5aff93eb32ed07b9e",
    "ledger_rebuilt": "d7e93098898c42e3a8606dc2d474cb5b",
    "ledger_unverified": "5668986f973549ddb78e268c6a606dc1",
    "manifest_cache_entry_ignored": "8cbb4f68266e43a7904f3ce84fe098c7",
    "manifest_cache_write_failed": "c70d8621d4aa47a08a1d2920e92339bb",
    "set_held": "ba29afab4bab4a0abaad5ae1166a9463",
    "spec_rejected": "6bcda02ebbe74ae985255bbaf96cea05",
    "disk_size_unknown": "a6218fcd79e1459590880fde48d865e9",
    "manifest_unavailable": "c7f6bdf212ff48348e03f94de92abb8d",
    "sync_retry_scheduled": "14d401b8edcc47edb6d7c700c0b064fc",
    "sync_failed": "b813216eab394fc2847cf9a97d409d54",
    "pulls_waiting": "b3757c5c0b66493e89df767d9a5ce930",
    "registry_pulls_held": "c2cc3fec9b204d1389f3d5f05b051772",
    "registry_pulls_waiting": "ef9a005ec60749a2aca18e48a000e6a0",
    "pinned_images_lost": "bebb67fb84d74287b99c99e224cdcf27",
    "pins_not_restored": "30788fa2bc494614985ad07da7ff7808",
    "stale_mirror_removed": "7d222ceee1cb4147afda7a7f1ee1c215",
    "stale_mirror_not_removed": "943e8ee3c519481fb20a398e4f708be9",
    "images_restored_from_store": "c578cd8e33ef42eab0b2398242f0fdd0",
    "store_blob_refused": "802de7a044b44e79827d84c70fd5d127",
    "restore_failed": "c31c0f22d0024f6182f9ebc342ad43db",
    "registry_set_not_stored": "d8c2b0a72c774ef7ae4faa2e560d0a1f",
    "store_blob_corrupt": "36c41866f2f94f529ec5305068fab25c",
    "store_record_damaged": "873d83cb726e4272800e7d512ed4862b",
    "peer_server_started": "aa7ca7d0be24403f938082f6e96e765c",
    "peer_refused": "25e651d4b6f743e3acd2da7f8c7f72d9",
    "connections_refused": "9ddd3919b79a4b09a77d45c2aa92e8c0",
    "http_request_failed": "c4202e98bfa74bbfa96ce50ccc601457",
    "connections_capped": "323f7f9257ef40e08487dc526c0794df",
    "peer_uploads_saturated": "78939ee4f0dc477abe3244ec1711580f",
    "peer_blob_corrupt": "c01154e9ca4f47aa89026501d7494e7b",
    "peer_blob_not_set_aside": "34ef489309af4e45976c9006e966c421",
    "blob_read_failed": "b22286148e09421da03e3da04ffcd667",
    "peer_tls_reload_failed": "28369d1c7af44186a16ad0d9b2cdb997",
    "peer_report_refused": "035f77b74d114a9b9b06f7ef2f902786",
    "peer_report_not_confirmed": "1909df8b584d4632ad2c3b8aae272899",
    "peer_report_not_delivered": "d76dbe66cd0c4316983f41e7fc6fd6a9",
    "node_mirror_not_started": "d6f9afe2f4044ad88ab9f645263f36e6",
    "node_mirror_socket_refused": "29b37fa94d634be48ffb252f6025601f",
    "session_server_not_started": "c0df1750b86e4f23b29dd336edeff10e",
    "session_server_lost": "e653fff447d644aa9ceae71de5e03277",
    "session_report_refused": "5c6b0919527e43d2808a040b25788a5d",
    "session_privileges_kept": "5cd42ca5679f47dcac290f6e2b165f00",
    "peer_server_waiting_for_tls": "806368813d6749dc840d547beeadb258",
    "node_mirror_blob_rejected": "0336632d22d44f7588ce52f8777a4f6e",
    "mirror_auth_file_invalid": "700089fa0fab4cf09156f02a8d0a9f6d",
    "mirror_auth_file_unreadable": "9d069756e19946f59313ef57b64d300d",
    "mirror_credential_not_published": "0f9a145048844680a8e1e2ea636928dd",
    "peer_holdings_invalid": "4ed92602dce34ccfa5473ecfea469d61",
    "peer_address_claimed_twice": "24b945c65373fa006a1edd7c71a2b55c",
    "peer_demoted": "e7408acf5c1cb8cf5ff494aa0ce0858b",
    "bundle_fetch_peer_dropped": "e768eaba4c034deca16025e1aa0e8b1b",
    "bundle_fetch_refused": "8d3c0e4edd45422da5e6331781aa56db",
    "bundle_fetch_failed": "5582f77861904d03b6e1cbc1892294a3",
    "site_holdings_unavailable": "9980cf66a788482399983c898fcce4c6",
    "site_holdings_not_published": "c80758574c9a461b8ccde1a6c0f82e6a",
    "site_holdings_watch_failed": "f7ac73c7c3774c1e9b5e8de2e2bbadcc",
    "site_address_unknown": "5689e46bd36744668c8cd1f812f1365f",
    "release_pinned": "e1825a14a9a249a186677c4727479481",
    "release_signatures_applied": "4b124317404946d9a1e847f3dab1a992",
    "release_signatures_not_applied": "9f86ef29e8bc4b5d8180adf63622cc52",
    "offline_not_ready": "fbf7083e858441079552daa8bacb084b",
    "pod_warning_not_sent": "8c4681021f37429c86c655457403f915",
    "set_failed": "4044b99a30ad4fc3a870cdf8fc8dae53",
    "pull_failed": "b40d0d8a314f478884e2f2467d5ad54e",
    "pull_stalled": "9acd9c907d5d447e8b28b55001eac50a",
    "progress_probe_failed": "4af43669b7614590ace30cd4ba549f85",
    "metrics_not_served": "d44d5d8135194708bbfbb9b00db173be",
    "critical_task_failed": "f1d6525ac2a749ce9a0b7c9877d2c06e",
    "critical_task_ended": "2f8842af49b44fa39d61993f9188fe4e",
    "optional_task_failed": "21008b14a06b4b6d9b8d04a4cc2b897f",
    "task_failed": "223c78cc26544d55a1fd606c0c61962e",
    "daemon_stopping_slowly": "71dd1f8160bd487ba81ac214f611ebd1",
    "notify_socket_unsupported": "7603cd11669e44628621af9681a5c089",
    "notify_failed": "b072247804de472cba6ca920bb879668",
    "registry_credentials_withheld": "10301ce0966d400aa695231136aeb079",
    "mirror_dropin_not_written": "5600e278963440f0b2aeb9a6f5329614",
    "mirror_dropin_reload_failed": "bedb54c9ac56478db243e2dd85e40c00",
    "registries_conf_invalid": "975d835776b94cbc9f7b96792f1ea72d",
    "served_tag_not_pulled": "a93495d53b0345b6863cec5d5747d6b9",
    "mirror_signatures_not_enabled": "fa2dbe0fe7d54b46be7648028a1b75b4",
    "mirror_signatures_not_removed": "002775a17c5646b7857f60a9a03905f2",
    "mirror_not_confirmed": "3edab2ca147b40e1aebbaf1b5e0622f8",
    "media_not_unmounted": "66b25cd275c94d599fc68e3559bd18a1",
    "bundle_image_not_removed": "57fbd3b5914841e08b8b01de18fe5d4f",
    "bundle_blobs_not_removed": "b6a5f2e9a91e4382a9724c13c46e5034",
    "media_unmount_deferred": "416457a7bf6c4e478ad5973370cd4e13",
    "signature_manifest_unreadable": "427a5c0aaffd4b88a7aca2c2bb45b4fa",
    "fetch_task_failed": "40d97a62c95f43bf9ad9163a52dc80c3",
    "release_retired": "a38b2a585d3a457dbbe8e954c8102f53",
    "release_retirement_held": "31c74906df804204bf51d21bdc36175a",
    "upgrade_started": "1d78e4baa6004c4ba5ac014ce0bb26d5",
    "upgrade_not_started": "4d0048b8d2874fcebe7fc15d6bc0b0ff",
    "stored_manifest_unreadable": "118f242ec9994f26b35d1c5dacf77a67",
    "event_not_written": "51d720615f944b9fa198c854d71fb1bc",
    "session_server_not_closed": "5bde62c6cb3a495b87da8fb5b013c676",
    "store_restore_skipped": "6f1412def74b4940b6f41fa0e9f12d3e",
    "session_socket_missing": "6b983633eef142938113b6e9497b3bc7",
    "session_spec_not_read": "a52766501ae9471495cb99755b8e4fa8",
    "session_spec_refused": "dbb6a14ae26f485a801ebb46e64ffcd8",
    "ed25519_refused": "346db82843b24dddbfa6bcaaef34ddaf",
}
"""Event name -> MESSAGE_ID (128-bit, hex). Never change an id once released."""

SUMMARIES: Final[Mapping[str, str]] = {
    "ed25519_refused": "This node cannot verify signed bundles: its crypto refuses Ed25519",
    "agent_image_refused": "A newer nodeagent image in a bundle was not switched to",
    "agent_image_stage_failed": "A newer nodeagent image could not be handed to the host",
    "agent_image_staged": "A newer nodeagent image was handed to the host to run",
    "bundle_media_detected": "An upgrade bundle was plugged in",
    "bundle_media_refused": "A plugged-in medium was not taken for an import",
    "udev_not_running": "udev is not running: plugged-in sticks are not seen",
    "udev_events_lost": "Some plug-in events were lost; the devices were counted again",
    "media_watch_failed": "nodeagent stopped seeing plugged-in sticks",
    "bundle_verified": "The upgrade bundle is authentic",
    "bundle_progressed": "A bundle copy or import is still under way",
    "bundle_stored": "The bundle is in the node's store: the medium may be removed",
    "bundle_rejected": "The upgrade bundle was refused",
    "bundle_blob_rejected": "A file of the bundle was damaged and was not handed to the runtime",
    "bundle_imported": "The upgrade bundle was imported",
    "bundle_signatures_unread": "A bundle's image signatures cannot be used yet",
    "bundle_interrupted": "The upgrade bundle import was interrupted",
    "bundle_rollback_allowed": "An older upgrade bundle was imported by hand",
    "rollback_marks_not_written": "The record of the newest bundles could not be saved",
    "bundle_manifest_unverified": "A bundle kept in the node's store no longer verifies",
    "bundle_expiry_ignored": "An expired upgrade bundle was imported by hand",
    "bundle_target_ignored": "A bundle meant for other nodes was imported by hand",
    "set_pinned": "The images of a PinnedImageSet are pinned",
    "disk_refused": "Not enough disk space for the images",
    "pins_not_effective": "The container runtime does not apply the pins",
    "runtime_config_invalid": "Another CRI-O configuration file is invalid",
    "sync_postponed": "The container runtime does not answer",
    "api_unreachable": "The Kubernetes API is unreachable",
    "status_write_failed": "The node's status could not be written to the cluster",
    "api_watch_failed": "Following the cluster's objects failed",
    "node_labels_unknown": "This node's labels could not be read from the cluster",
    "node_os_source_failed": "A part of the node's OS version could not be read",
    "node_not_found": "The cluster has no Node by this node's name",
    "pool_membership_invalid": "This node is in more than one custom MachineConfigPool",
    "pool_ignored": "A MachineConfigPool that matches this node was not used",
    "state_file_damaged": "A damaged state file was set aside and rebuilt",
    "watch_queue_overflowed": "Too many file changes at once: the folders are read again",
    "status_not_saved": "nodeagent's status file could not be written",
    "state_not_saved": "A state file of nodeagent could not be written",
    "state_copy_not_saved": "A spare copy of nodeagent's state could not be written",
    "state_file_not_moved": "A damaged state file could not be set aside",
    "ledger_rebuilt": "nodeagent's record of its pins was rebuilt",
    "ledger_unverified": "nodeagent's record of its pins could not be read back",
    "manifest_cache_entry_ignored": "A cached image description could not be read",
    "manifest_cache_write_failed": "An image description could not be cached",
    "set_held": "A PinnedImageSet stays pinned although its file is invalid",
    "spec_rejected": "A PinnedImageSet file is invalid and was not taken",
    "disk_size_unknown": "An image's size is unknown: its set waits",
    "manifest_unavailable": "An image's size could not be learned from its registry",
    "sync_retry_scheduled": "A transient failure: nodeagent retries soon",
    "sync_failed": "A sync could not run",
    "pulls_waiting": "Pulls are waiting on a transient cause",
    "registry_pulls_held": "The node is not fit for pulls: registry pulls wait",
    "registry_pulls_waiting": "Registry pulls of this sync wait for the node to be fit",
    "pinned_images_lost": "Pinned images are gone from the container runtime",
    "pins_not_restored": "CRI-O's list of pinned images could not be written at start",
    "stale_mirror_removed": "A leftover loopback mirror setting was removed",
    "stale_mirror_not_removed": "A leftover loopback mirror setting could not be removed",
    "images_restored_from_store": "Images were restored from nodeagent's local store",
    "store_blob_refused": "A damaged file of the node's store was not restored",
    "restore_failed": "An image could not be restored from the node's store",
    "registry_set_not_stored": "A registry set's images were not kept in nodeagent's local store",
    "store_blob_corrupt": "A damaged blob was removed from nodeagent's local store",
    "store_record_damaged": "A record of nodeagent's store was damaged and set aside",
    "peer_server_started": "This node serves its image store to the site's other nodes",
    "peer_refused": "A peer was refused at the TLS handshake",
    "connections_refused": "Connections from one address were refused",
    "http_request_failed": "A request nodeagent could not read was refused",
    "connections_capped": "A server of nodeagent reached its connection cap",
    "peer_uploads_saturated": "The peer server is at its upload limit",
    "peer_blob_corrupt": "A damaged blob was found while serving it to a peer",
    "peer_blob_not_set_aside": "A damaged file could not be removed from the store",
    "blob_read_failed": "A file of the store could not be read while being served",
    "peer_tls_reload_failed": "The peer server's new certificate could not be loaded",
    "peer_report_refused": "A report from the peer server was refused",
    "peer_report_not_confirmed": "The peer server reported a damaged file the daemon found sound",
    "peer_report_not_delivered": "The peer server could not report to the daemon",
    "node_mirror_not_started": "The node mirror could not listen",
    "peer_server_waiting_for_tls": "The peer server waits for its certificate",
    "node_mirror_blob_rejected": "The node mirror found a damaged file in the store",
    "mirror_auth_file_invalid": "An auth file for the node mirror could not be read as JSON",
    "mirror_auth_file_unreadable": "An auth file for the node mirror could not be opened",
    "mirror_credential_not_published": "The node mirror's credential could not be written",
    "peer_holdings_invalid": "A node's published holdings were not understood",
    "peer_address_claimed_twice": "Two nodes' published holdings name the same address",
    "peer_demoted": "A peer was demoted: it is asked last for a while",
    "bundle_fetch_peer_dropped": "A peer failed during a bundle fetch and was left out",
    "bundle_fetch_refused": "A bundle offered by the site's peers was not taken",
    "bundle_fetch_failed": "A bundle could not be fetched from the site's peers",
    "site_holdings_unavailable": "The cluster does not know NodeImageHoldings yet",
    "site_holdings_not_published": "This node's holdings could not be published",
    "site_holdings_watch_failed": "The other nodes' holdings cannot be followed",
    "site_address_unknown": "Other nodes cannot be told where this node serves",
    "release_pinned": "An OpenShift release is pinned on this node",
    "release_signatures_applied": (
        "The release's signatures were given to the cluster-version operator"
    ),
    "release_signatures_not_applied": "The release's signatures must be applied by hand",
    "offline_not_ready": "This node would not survive without its registry",
    "pod_warning_not_sent": "A warning about a pod could not be posted to the cluster",
    "set_failed": "A PinnedImageSet could not be pinned",
    "pull_failed": "An image could not be pulled",
    "pull_stalled": "A pull made no progress and was stopped",
    "progress_probe_failed": "nodeagent cannot see whether its pulls move",
    "metrics_not_served": "The metrics endpoint cannot listen",
    "critical_task_failed": "A vital part of nodeagent failed: nodeagent stops",
    "critical_task_ended": "A vital part of nodeagent ended: nodeagent stops",
    "optional_task_failed": "A part of nodeagent failed and is restarted",
    "task_failed": "A one-off job of nodeagent failed",
    "daemon_stopping_slowly": "nodeagent is taking long to stop",
    "notify_socket_unsupported": "nodeagent cannot talk to systemd's notify socket",
    "notify_failed": "A message to systemd was not delivered",
    "registry_credentials_withheld": (
        "Registry credentials were not sent to a plain-HTTP token server"
    ),
    "mirror_dropin_not_written": "The node mirror's registries.conf drop-in was not written",
    "mirror_dropin_reload_failed": (
        "CRI-O was not reloaded after the node mirror's drop-in changed"
    ),
    "registries_conf_invalid": "The registries configuration cannot be read",
    "served_tag_not_pulled": "A tag a bundle serves was not pulled at its import",
    "mirror_signatures_not_enabled": (
        "Image signatures of the bundle could not be offered during its import"
    ),
    "mirror_signatures_not_removed": (
        "A temporary signature setting was not removed after an import"
    ),
    "mirror_not_confirmed": "The container runtime did not confirm it uses the import's mirror",
    "media_not_unmounted": "A bundle medium stayed mounted after its import",
    "bundle_image_not_removed": "An image of a refused bundle could not be removed",
    "bundle_blobs_not_removed": "The blobs a refused bundle's copy stored could not be removed",
    "media_unmount_deferred": "A medium was still in use when it was unmounted",
    "signature_manifest_unreadable": "A stored image signature could not be read",
    "fetch_task_failed": "A part of a bundle transfer ended with an internal error",
    "release_not_an_upgrade": "The release on the stick is not an upgrade of this cluster",
    "upgrade_target_not_pinned": (
        "The cluster is asked to upgrade to a release this node has not pinned"
    ),
    "cluster_version_invalid": "The cluster's ClusterVersion could not be read",
    "node_mirror_socket_refused": "The node mirror refused the socket systemd gave it",
    "release_retired": "An old release was unpinned after the cluster's upgrade finished",
    "release_retirement_held": "Old releases are not retired: the cluster's version cannot be read",
    "upgrade_started": "This node started the cluster's upgrade",
    "upgrade_not_started": "The site is ready but this node could not start the upgrade",
    "stored_manifest_unreadable": "A stored bundle's signed list could not be read",
    "event_not_written": "A Kubernetes Event could not be written",
    "session_server_not_closed": "An import's loopback server did not stop in time",
    "store_restore_skipped": "Images were not brought back from the node's store this time",
    "session_socket_missing": "An import's loopback server was started without its socket",
    "session_spec_not_read": "An import's loopback server got no description of what to serve",
    "session_spec_refused": "An import's loopback server refused what it was asked to serve",
    "session_server_not_started": "An import's loopback server could not be started",
    "session_server_lost": "An import's loopback server ended during the import",
    "session_report_refused": "An import's loopback server sent something the daemon refused",
    "session_privileges_kept": "An import's loopback server kept privileges it wanted to drop",
}
"""Event name -> the one-line summary its journal and console lines lead with: the
catalog entry's Subject, word for word (tests/unit/test_journal.py checks it)."""

FIELD_NAMES: Final[Mapping[str, str]] = {
    "set": "NODEAGENT_SET",
    "image": "NODEAGENT_IMAGE",
    "bundle": "NODEAGENT_BUNDLE_ID",
    "reason": "NODEAGENT_REASON",
    "device": "NODEAGENT_DEVICE",
    "file": "NODEAGENT_FILE",
    "address": "NODEAGENT_ADDRESS",
    "node": "NODEAGENT_NODE",
}
"""Log fields that also become journal fields of their own, for ``journalctl FIELD=value``."""

PRIORITIES: Final[Mapping[str, int]] = {
    "debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2,
}  # fmt: skip


def summary(event: str) -> str | None:
    """The sentence a line of ``event`` leads with (a full stop added), or None."""
    text = SUMMARIES.get(event)
    return None if text is None else f"{text}."


def entry_fields(
    event: str, level: str, message: str, fields: Mapping[str, object]
) -> list[tuple[str, str]]:
    """The journal fields of one log event, in a stable order."""
    entry = [
        ("MESSAGE", message),
        ("PRIORITY", str(PRIORITIES.get(level, 6))),
        ("SYSLOG_IDENTIFIER", "nodeagent"),
        ("NODEAGENT_EVENT", event),
    ]
    if event in MESSAGE_IDS:
        entry.append(("MESSAGE_ID", MESSAGE_IDS[event]))
    for key, name in FIELD_NAMES.items():
        value = fields.get(key)
        if value not in (None, ""):
            entry.append((name, str(value)))
    return entry


def serialize(entry: list[tuple[str, str]]) -> bytes:
    """journald's native protocol: ``NAME=value\\n``, or a length-prefixed value when it has a
    newline."""
    out = bytearray()
    for name, value in entry:
        data = value.encode()
        if b"\n" in data:
            out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name.encode() + b"=" + data + b"\n"
    return bytes(out)
