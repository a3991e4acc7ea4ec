# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""Fixtures shared by the pytest tests under tests/ (what they need from the machine: prerequisites.py).

``ansible-test units`` loads this file too (its pytest's rootdir is the collection root), as a module of the
collection and with its own requirements: so it imports only the standard library and pytest at its top, and
prerequisites.py (beside it, on ``sys.path`` in the repository's own pytest runs) only inside the fixtures.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest


@pytest.fixture
def nspawn_host_prerequisites():
    """A systemd-nspawn test host can boot here (root, the tools, the images of
    scripts/test-hosts/build-images.sh); else the test is skipped, or fails in CI."""
    from prerequisites import cannot_run, nspawn_host_missing  # pylint: disable=import-outside-toplevel

    missing = nspawn_host_missing()
    if missing:
        cannot_run("a systemd-nspawn test host cannot run: {0}".format(missing))
