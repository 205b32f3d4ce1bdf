"""``python -m broker`` is the ``trellis`` command."""

import sys

from broker.tools.cli import main

sys.exit(main())
