"""journald entries: stable MESSAGE_IDs for what a technician cares about, and structured fields.

Pure: builds the field list of one entry and serializes it in journald's native
protocol. ``adapters/journald.py`` sends it; ``systemd/nodeagent.catalog`` explains each
MESSAGE_ID (``journalctl -x -u nodeagent``). Filter with e.g.
``journalctl NODEAGENT_SET=line-3`` or ``journalctl NODEAGENT_REASON=InsufficientDiskSpace``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Final

MESSAGE_IDS: Final[Mapping[str, str]] = {
    "bundle_media_detected": "2bef3c816d034df1948ae136b5af10b6",
    "bundle_media_refused": "f1f0a02dc1544c24a780905f9af92eb9",
    "bundle_verified": "cf34c67bb85f4cb299fc54349e55fbb7",
    "bundle_rejected": "3bb42212bdcd4e10bd895d59597a68a7",
    "bundle_imported": "d95642eae4464b609dd352a0a3e4f85a",
    "bundle_interrupted": "7f26e153ace44e4f950bf9d94fd07b0c",
    "bundle_rollback_allowed": "f21af989da854a4ebfdc9da762d2fda9",
    "bundle_manifest_unverified": "28ab66c4f86d4514ab13091aeeb6ec75",
    "bundle_expiry_ignored": "bcccb3cc6c0043a9b60ad1def35b2dd2",
    "set_pinned": "7df08b85c4b34afa83dbe406526c96c7",
    "disk_refused": "b84a77b14e54466a992b99b0cc636a10",
    "pins_not_effective": "2ec2615e533346d2a372262a16879e4b",
    "sync_postponed": "a96346cdafca4ee1ba4c2888ff890552",
    "api_unreachable": "0275a7867ead41dea72a6e1aafd530c3",
    "state_file_damaged": "6094319f540a4e069592a6ec72fb37da",
    "set_held": "ba29afab4bab4a0abaad5ae1166a9463",
    "disk_size_unknown": "a6218fcd79e1459590880fde48d865e9",
    "sync_retry_scheduled": "14d401b8edcc47edb6d7c700c0b064fc",
    "pulls_waiting": "b3757c5c0b66493e89df767d9a5ce930",
    "pinned_images_lost": "bebb67fb84d74287b99c99e224cdcf27",
    "images_restored_from_store": "c578cd8e33ef42eab0b2398242f0fdd0",
    "registry_set_not_stored": "d8c2b0a72c774ef7ae4faa2e560d0a1f",
    "store_blob_corrupt": "36c41866f2f94f529ec5305068fab25c",
    "peer_server_started": "aa7ca7d0be24403f938082f6e96e765c",
    "peer_refused": "25e651d4b6f743e3acd2da7f8c7f72d9",
    "connections_refused": "9ddd3919b79a4b09a77d45c2aa92e8c0",
    "http_request_failed": "c4202e98bfa74bbfa96ce50ccc601457",
    "connections_capped": "323f7f9257ef40e08487dc526c0794df",
    "peer_uploads_saturated": "78939ee4f0dc477abe3244ec1711580f",
    "peer_blob_corrupt": "c01154e9ca4f47aa89026501d7494e7b",
    "peer_tls_reload_failed": "28369d1c7af44186a16ad0d9b2cdb997",
    "peer_report_refused": "035f77b74d114a9b9b06f7ef2f902786",
    "peer_report_not_confirmed": "1909df8b584d4632ad2c3b8aae272899",
    "peer_report_not_delivered": "d76dbe66cd0c4316983f41e7fc6fd6a9",
    "node_mirror_not_started": "d6f9afe2f4044ad88ab9f645263f36e6",
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
    "site_holdings_unavailable": "9980cf66a788482399983c898fcce4c6",
    "site_holdings_not_published": "c80758574c9a461b8ccde1a6c0f82e6a",
    "site_address_unknown": "5689e46bd36744668c8cd1f812f1365f",
    "release_pinned": "e1825a14a9a249a186677c4727479481",
    "release_signatures_applied": "4b124317404946d9a1e847f3dab1a992",
    "release_signatures_not_applied": "9f86ef29e8bc4b5d8180adf63622cc52",
    "offline_not_ready": "fbf7083e858441079552daa8bacb084b",
    "set_failed": "4044b99a30ad4fc3a870cdf8fc8dae53",
    "metrics_not_served": "d44d5d8135194708bbfbb9b00db173be",
    "registry_credentials_withheld": "10301ce0966d400aa695231136aeb079",
    "mirror_dropin_not_written": "5600e278963440f0b2aeb9a6f5329614",
    "mirror_dropin_reload_failed": "bedb54c9ac56478db243e2dd85e40c00",
    "served_tag_not_pulled": "a93495d53b0345b6863cec5d5747d6b9",
}
"""Event name -> MESSAGE_ID (128-bit, hex). Never change an id once released."""

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
