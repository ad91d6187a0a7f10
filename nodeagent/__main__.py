"""``python -m nodeagent`` is the ``nodeagent`` command."""

import sys

from nodeagent.cli.main import main

sys.exit(main())
