# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The per-test timeout (pytest-timeout) for every pytest run in this repository (tests/, python/*/tests).

* ``pytest.ini`` sets the timeout and its method. ``ansible-test units`` runs pytest with a configuration
  file of its own, so when no timeout is set at all (option, ``PYTEST_TIMEOUT`` or ini), the values are
  read from ``pytest.ini`` here: ``scripts/test.sh units`` gets the same timeout as everything else.
* The thread method ends the whole run (``os._exit``) after printing every thread's stack, and names no
  test. The timer below does the same but says first, and last, which test ran out of time, so that a hang
  fails by name; and it kills this process's children first (see ``_out_of_time``).

Without pytest-timeout installed (a bare ``pytest``) this file does nothing.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import faulthandler
import os
import signal
import sys
import threading
import traceback

try:
    from configparser import ConfigParser
except ImportError:  # pragma: no cover - Python 2 never runs these tests
    ConfigParser = None

import pytest

PYTEST_INI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytest.ini")


def _pytest_ini_timeout():
    """``(timeout, method)`` from the repository's pytest.ini; ``(None, None)`` when it sets none."""
    if ConfigParser is None or not os.path.isfile(PYTEST_INI):
        return None, None
    parser = ConfigParser()
    parser.read(PYTEST_INI)
    if not parser.has_section("pytest"):
        return None, None
    return parser.get("pytest", "timeout", fallback=None), parser.get("pytest", "timeout_method", fallback=None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # tryfirst: pytest-timeout reads its settings in its own pytest_configure, which must see these.
    if not config.pluginmanager.hasplugin("timeout"):
        return
    if config.getoption("timeout") is not None or os.environ.get("PYTEST_TIMEOUT") or config.getini("timeout"):
        return  # set on the command line, in the environment or in the ini file pytest read
    timeout, method = _pytest_ini_timeout()
    if timeout:
        config.option.timeout = float(timeout)
        if method and config.getoption("timeout_method") is None and not config.getini("timeout_method"):
            config.option.timeout_method = method


def _children():
    """Pids of this process's children (Linux ``/proc``; elsewhere none are found)."""
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join("/proc", entry, "stat")) as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me:
            found.append(int(entry))
    return found


def _report(item, settings):
    capman = item.config.pluginmanager.getplugin("capturemanager")
    out = err = ""
    if capman is not None:
        capman.suspend_global_capture(item)
        out, err = capman.read_global_capture()
    # Straight to the process's stderr: under pytest-xdist, stdout (and so pytest's terminal) is /dev/null.
    stream = sys.__stderr__
    banner = "TIMEOUT: {0} ran longer than {1:g} s".format(item.nodeid, settings.timeout)
    stream.write("\n{0}\n".format(banner))
    for title, text in (("captured stdout", out), ("captured stderr", err)):
        if text:
            stream.write("---- {0} ----\n{1}\n".format(title, text))
    stream.write("---- the stack of every thread ----\n")
    stream.flush()
    faulthandler.dump_traceback(file=stream, all_threads=True)
    stream.write("{0}\n".format(banner))
    stream.flush()


def _out_of_time(item, settings):
    try:
        _report(item, settings)
    except Exception:  # pylint: disable=broad-except
        traceback.print_exc(file=sys.__stderr__)
    finally:
        # The run ends here: a thread that hangs cannot be stopped. Children go first: under ansible-test
        # units each test runs in a forked child (ansible_forked), which holds pytest-xdist's pipes open, so
        # xdist would never see this worker end (and name the test) while the child lived on. Processes the
        # test started (simulators, workers) are children too, and would otherwise outlive the run.
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(1)  # pylint: disable=protected-access


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's thread method, with the test's name in the report."""
    if settings.method != "thread":
        return None  # pytest-timeout's signal method names the test itself, as a failure
    timer = threading.Timer(settings.timeout, _out_of_time, (item, settings))
    timer.name = "pytest-timeout {0}".format(item.nodeid)
    timer.daemon = True

    def cancel():
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel  # what pytest-timeout's pytest_timeout_cancel_timer calls
    timer.start()
    return True
