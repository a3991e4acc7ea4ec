"""devin-outposts: the Devin Outposts worker, fleet client and fleet simulator.

This package never imports Ansible: the ``devin.outposts.worker`` role installs it into its own venv.
"""

from __future__ import annotations

__version__ = "0.1.0"
