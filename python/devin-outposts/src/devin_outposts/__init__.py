"""devin-outposts: the Devin Outposts fleet client, the worker (``worker start``) and the orchestrator
(``orchestrate``).

* :mod:`devin_outposts.api`: the async fleet API client, its wire models and errors (imports nothing of
  ours);
* :mod:`devin_outposts.core`: the claim-and-serve machinery both programs run on (imports ``api`` only);
* :mod:`devin_outposts.worker`: the worker (imports ``core`` and ``api``, never the orchestrator);
* :mod:`devin_outposts.orchestrator`: the orchestrator (imports ``core`` and ``api``, never the worker);
* :mod:`devin_outposts.cli`: the ``devin-outposts`` command (on top of all);
* :mod:`devin_outposts.privacy`: stdlib only, the first thing the command imports.

This is what worker hosts get. It never imports Ansible, and never the fleet simulator, which is its own
distribution (``devin-outposts-sim``) for development, CI and controllers. The layers are checked by
import-linter (``python/importlinter.ini``).
"""

from __future__ import annotations

__version__ = "0.1.0"
