from __future__ import annotations

import sys

from devin_outposts.cli import main

if __name__ == "__main__":
    sys.exit(main())
