"""devin-outposts: the Devin Outposts fleet client and worker (``devin-outposts worker start``).

* :mod:`devin_outposts.api`: the async fleet API client, its wire models and errors (imports nothing of
  ours);
* :mod:`devin_outposts.worker`: the worker (imports ``api`` only);
* :mod:`devin_outposts.cli`: the ``devin-outposts`` command (on top of both).

This is what worker hosts get. It never imports Ansible, and never the fleet simulator, which is its own
distribution (``devin-outposts-sim``) for development, CI and controllers. The layers are checked by
import-linter (``python/importlinter.ini``).
"""

from __future__ import annotations

__version__ = "0.1.0"
