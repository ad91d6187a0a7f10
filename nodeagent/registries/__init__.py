"""Registries as nodeagent sees them: image names, registries.conf, manifests, HTTP answers.

Pure, no I/O: the distribution protocol's parts that can be tested without a network and
used by concern modules without importing an adapter. Every reader here maps every input
to a value or an error of the tree with its reason code (docs/security.md, "Registry and
credential inputs"):

* ``names``: ``parse_docker_reference`` splits an image name the way docker and
  containers-image do into a ``DockerReference``;
* ``conf``: ``read_registries_conf`` reads registries.conf and its drop-ins strictly
  (``ConfigInvalid`` naming the file and key); ``insecure_registries`` and
  ``is_insecure`` say which locations are plain HTTP;
* ``manifests``: ``read_manifest``, ``parse_manifest``, ``select_platform`` and
  ``verify_digest`` turn manifest bodies into what disk admission and bundles need;
* ``answers``: ``pick_challenge`` reads a ``WWW-Authenticate`` header,
  ``parse_token_answer`` a token server's answer, ``basic_authorization`` answers a
  basic challenge, and ``status_error`` maps HTTP statuses to the error tree.

The HTTP side is ``nodeagent.adapters.registry.client``.
"""

from nodeagent.registries.answers import (
    DEFAULT_TOKEN_LIFETIME_S,
    TokenAnswer,
    basic_authorization,
    parse_token_answer,
    pick_challenge,
    retry_after_s,
    status_error,
)
from nodeagent.registries.conf import (
    MAX_REGISTRIES_CONF_BYTES,
    Mirror,
    RegistriesConf,
    RegistryEntry,
    insecure_locations,
    insecure_registries,
    is_insecure,
    read_registries_conf,
)
from nodeagent.registries.manifests import (
    IMAGE_MEDIA_TYPES,
    INDEX_MEDIA_TYPES,
    LINUX_ARCHITECTURES,
    MANIFEST_ACCEPT,
    MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    MAX_SIZE_BYTES,
    MEDIA_TYPE_DOCKER_LIST,
    MEDIA_TYPE_DOCKER_MANIFEST,
    MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST,
    Descriptor,
    ImageManifest,
    Manifest,
    ManifestIndex,
    Platform,
    node_platform,
    parse_manifest,
    read_image_config_platform,
    read_manifest,
    select_platform,
    verify_digest,
)
from nodeagent.registries.names import (
    DOCKER_HUB,
    DOCKER_HUB_ALIASES,
    DockerReference,
    is_sha256_digest,
    normalize_registry,
    parse_docker_digest_reference,
    parse_docker_reference,
)
from nodeagent.strict.http import Challenge

__all__ = [
    "DEFAULT_TOKEN_LIFETIME_S",
    "DOCKER_HUB",
    "DOCKER_HUB_ALIASES",
    "IMAGE_MEDIA_TYPES",
    "INDEX_MEDIA_TYPES",
    "MANIFEST_ACCEPT",
    "MAX_CONFIG_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_REGISTRIES_CONF_BYTES",
    "MAX_SIZE_BYTES",
    "MEDIA_TYPE_DOCKER_LIST",
    "MEDIA_TYPE_DOCKER_MANIFEST",
    "MEDIA_TYPE_OCI_INDEX",
    "MEDIA_TYPE_OCI_MANIFEST",
    "Challenge",
    "Descriptor",
    "DockerReference",
    "ImageManifest",
    "Manifest",
    "ManifestIndex",
    "Mirror",
    "LINUX_ARCHITECTURES",
    "Platform",
    "RegistriesConf",
    "RegistryEntry",
    "TokenAnswer",
    "basic_authorization",
    "insecure_locations",
    "insecure_registries",
    "is_insecure",
    "is_sha256_digest",
    "node_platform",
    "normalize_registry",
    "parse_docker_digest_reference",
    "parse_docker_reference",
    "parse_manifest",
    "parse_token_answer",
    "pick_challenge",
    "read_image_config_platform",
    "read_manifest",
    "read_registries_conf",
    "retry_after_s",
    "select_platform",
    "status_error",
    "verify_digest",
]
