"""``python -m logstore``: the ``logstore`` command."""

import sys

from .cli import main

sys.exit(main())
