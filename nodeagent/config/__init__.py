"""nodeagent's configuration: a TOML main file plus ``config.d/*.toml`` drop-ins.

``settings``: every key, its meaning, unit, default and reason, as frozen dataclasses
gathered in ``Config``. ``loading``: how the files become a ``Config`` (merge order,
types, ranges, errors). ``rerooting``: host paths under a fake root, for tests.

Callers import from here.
"""

from __future__ import annotations

from nodeagent.config.loading import LOG_LEVELS as LOG_LEVELS
from nodeagent.config.loading import load_config as load_config
from nodeagent.config.mirror import NODE_MIRROR_DROPIN_NAME as NODE_MIRROR_DROPIN_NAME
from nodeagent.config.mirror import MirrorSettings as MirrorSettings
from nodeagent.config.monitoring import MetricsSettings as MetricsSettings
from nodeagent.config.rerooting import reroot as reroot
from nodeagent.config.settings import DEFAULT_CONFIG_PATH as DEFAULT_CONFIG_PATH
from nodeagent.config.settings import DROPIN_DIR_NAME as DROPIN_DIR_NAME
from nodeagent.config.settings import BundleSettings as BundleSettings
from nodeagent.config.settings import ClusterSettings as ClusterSettings
from nodeagent.config.settings import Config as Config
from nodeagent.config.settings import DiskSettings as DiskSettings
from nodeagent.config.settings import LogSettings as LogSettings
from nodeagent.config.settings import NodeOsSettings as NodeOsSettings
from nodeagent.config.settings import OfflineSettings as OfflineSettings
from nodeagent.config.settings import PullSettings as PullSettings
from nodeagent.config.settings import RuntimeSettings as RuntimeSettings
from nodeagent.config.settings import SpecSettings as SpecSettings
from nodeagent.config.settings import StateSettings as StateSettings
from nodeagent.config.settings import StoreSettings as StoreSettings
from nodeagent.config.upgrade import UpgradeSettings as UpgradeSettings
