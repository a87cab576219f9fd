"""``python -m agentlightning.cli`` is ``agl``."""

import sys

from agentlightning.cli import main

sys.exit(main())
