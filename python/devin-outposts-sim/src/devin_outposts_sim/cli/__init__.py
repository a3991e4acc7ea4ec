"""The ``devin-outposts-sim`` command (also ``python -m devin_outposts_sim``).

* :mod:`~devin_outposts_sim.cli.command`: the parser, ``serve`` and the admin verbs (tokens, outposts,
  the queue, records); :func:`main` is the console script's entry point.
* :mod:`~devin_outposts_sim.cli.remote`: the brain verbs and ``dist`` (the ``devin-remote`` builds);
  :mod:`~devin_outposts_sim.cli.devin_cli`: ``devin-cli`` (the official Devin CLI builds).
* :mod:`~devin_outposts_sim.cli.common`: exit codes and output helpers shared by the verbs.

Every verb but ``serve`` talks to a running simulator through
:class:`~devin_outposts_sim.admin_client.SimAdmin`.
"""

from __future__ import annotations

from devin_outposts_sim.cli.command import main

__all__ = ["main"]
