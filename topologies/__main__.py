"""`python -m topologies ...`: see topologies.cli."""

import sys

from .cli import main

sys.exit(main())
