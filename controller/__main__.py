"""`python -m controller ...` is `egress-placer ...`."""

import sys

from controller.cli import main

sys.exit(main())
