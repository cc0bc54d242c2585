"""``python -m jepsen run ...``: see ``jepsen.run`` and docs/jepsen.md."""

import sys

from jepsen.run import main

sys.exit(main())
