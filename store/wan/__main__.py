"""``python -m store.wan``: the same as ``meridian wan-proxy``."""

import sys

from store.wan.cli import main

sys.exit(main())
