"""The stand-in ``devin-remote`` and the tool calls it runs.

* :mod:`~devin_outposts_sim.remote.standin`: the stand-in itself, one file of standard-library Python.
  The simulator publishes its source as the built-in ``devin-remote`` build
  (:mod:`~devin_outposts_sim.state.dist`), so it must stay importable from nothing: a worker runs it as a
  script, with this folder (not the simulator) on ``sys.path``.
* :mod:`~devin_outposts_sim.remote.tools`: the tool calls the simulated brain can script (validated by the
  brain API, built by tests), which the stand-in carries out.

Why a folder of its own: a script's folder is the first entry of its ``sys.path``, so nothing here may
share a name with a standard-library module (the simulator's ``http`` package would shadow the stdlib's
``http`` that ``urllib.request`` imports).
"""

from __future__ import annotations

from pathlib import Path

#: The stand-in's file name in this folder.
STANDIN_FILE = "standin.py"


def standin_path() -> Path:
    """The stand-in ``devin-remote`` script shipped in this package."""
    return Path(__file__).with_name(STANDIN_FILE)
