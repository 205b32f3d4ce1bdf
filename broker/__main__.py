"""``python -m broker`` is the ``trellis`` command."""

import sys

from broker.cli import main

sys.exit(main())
