"""The simulator fixtures (``sim``, ``make_sim``, ``outpost``, tokens, ``watch``) for these tests."""

from devin_outposts_sim.pytest_plugin import *  # noqa: F403 - fixtures are found by name
