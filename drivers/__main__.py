"""``python -m drivers run CONFIG.toml ...``: the same CLI as ``transformer-pde``."""

import sys

from drivers.engine import main

sys.exit(main())
