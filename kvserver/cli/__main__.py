"""``python -m kvserver.cli``: the same entry point as the ``raftkv`` command."""

import sys

from kvserver.cli import main

sys.exit(main())
