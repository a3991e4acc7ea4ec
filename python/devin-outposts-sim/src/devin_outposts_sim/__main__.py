"""``python -m devin_outposts_sim``: the same as the ``devin-outposts-sim`` command."""

from __future__ import annotations

import sys

from devin_outposts_sim.cli import main

sys.exit(main())
