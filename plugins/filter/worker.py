# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""What the devin.outposts.worker role computes, in Python rather than in Jinja.

The role used to build lists with ``rows.append`` inside ``vars:`` and to render a template to JSON only to
parse it back. These filters do the same work where it can be read and unit-tested
(tests/unit/plugins/filter/test_worker.py):

* ``worker_instances``: the instances with every default filled in (tokens left out);
* ``worker_instance_dirs``: the data and working directories to create, one row per directory;
* ``worker_instance_leftovers``: the paths to delete for instances in state ``absent``;
* ``worker_token_files``: the token file of each bundled instance, with the token it holds;
* ``worker_outpost_checks``: the outposts that the preflight looked up, one row per instance;
* ``worker_pip_argv``: the pip command line that installs the worker package;
* ``worker_exec_args``: extra worker arguments, quoted for a systemd ``ExecStart=`` line;
* ``worker_host_instances``: the instances installed on a host, read from their drop-ins;
* ``worker_outposts_to_create``: the outposts (by name) of every host of the play, with their host's platform.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import re

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.text.converters import to_text

_INSTANCE_KEYS = frozenset(
    ["name", "outpost", "state", "implementation", "max_sessions", "workdir", "token", "env", "acceptor_id",
     "drain_timeout", "api_url", "extra_args", "fleet_size"]
)
_STATES = ("started", "stopped", "absent")
_IMPLEMENTATIONS = ("bundled", "devin_cli")


def _text(value, default=""):
    if value is None:
        return default
    return to_text(value)


def _bool(value):
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _int(value, what):
    try:
        return int(value)
    except (TypeError, ValueError):
        raise AnsibleFilterError("{0} must be an integer, got {1!r}".format(what, value))


def _extra_args(value, what):
    """A list of strings; refuses anything that would put a token on the command line.

    argparse accepts any unambiguous prefix of a long option (``--tok`` means ``--token``), so every prefix of
    ``--token`` longer than ``--`` is refused, with or without ``=value``.
    """
    if value is None:
        return []
    if not isinstance(value, list):
        raise AnsibleFilterError("{0} must be a list of strings".format(what))
    args = []
    for arg in value:
        if not isinstance(arg, str) and not isinstance(arg, (int, float)):
            raise AnsibleFilterError("{0} must be a list of strings, got {1}".format(what, type(arg).__name__))
        text = to_text(arg)
        flag = text.split("=", 1)[0]
        if len(flag) > 2 and "--token".startswith(flag):
            raise AnsibleFilterError(
                "{0}: {1} would put the token on the command line, where every user of the host can read it; "
                "the token goes in devin_outposts_worker_token (a 0600 root-only file on the host) only".format(what, flag)
            )
        if "\n" in text or "\r" in text or "\x00" in text:
            raise AnsibleFilterError("{0}: an argument must be one line".format(what))
        args.append(text)
    return args


def worker_instances(instances, defaults):
    """Resolve ``devin_outposts_worker_instances`` against the role's defaults.

    ``defaults`` holds ``max_sessions``, ``drain_timeout``, ``workdir_root``, ``data_dir``, ``env``,
    ``api_url``, ``extra_args`` (the global extra worker arguments), ``sep`` (the path separator that joins the
    roots and the instance name: ``/``, or ``\\`` on Windows) and ``has_token`` (whether there is a default token: the token itself is never passed, so
    this filter's input and output can be shown and logged; an item's own ``token`` only counts as present).
    Unknown keys and wrong types fail with one line naming the instance, so a typo is not silently ignored.
    """
    if not isinstance(instances, list):
        raise AnsibleFilterError("devin_outposts_worker_instances must be a list, got {0}".format(type(instances).__name__))
    rows = []
    for index, item in enumerate(instances):
        if not isinstance(item, dict):
            raise AnsibleFilterError("devin_outposts_worker_instances[{0}] must be a dict".format(index))
        name = _text(item.get("name"))
        label = "instance {0}".format(name or "#{0}".format(index))
        unknown = sorted(set(item) - _INSTANCE_KEYS)
        if unknown:
            raise AnsibleFilterError(
                "{0}: unknown key(s) {1}; the keys are {2}".format(label, ", ".join(unknown), ", ".join(sorted(_INSTANCE_KEYS)))
            )
        state = _text(item.get("state"), "started") or "started"
        if state not in _STATES:
            raise AnsibleFilterError("{0}: state must be one of {1}, got {2}".format(label, ", ".join(_STATES), state))
        implementation = _text(item.get("implementation"), "bundled") or "bundled"
        if implementation not in _IMPLEMENTATIONS:
            raise AnsibleFilterError(
                "{0}: implementation must be one of {1}, got {2}".format(label, ", ".join(_IMPLEMENTATIONS), implementation)
            )
        env = dict(defaults.get("env") or {})
        own_env = item.get("env") or {}
        if not isinstance(own_env, dict):
            raise AnsibleFilterError("{0}: env must be a dict".format(label))
        env.update(own_env)
        has_token = bool(item.get("token")) or _bool(defaults.get("has_token"))
        extra_args = (_extra_args(defaults.get("extra_args"), "devin_outposts_worker_extra_args")
                      + _extra_args(item.get("extra_args"), label + ": extra_args"))
        sep = _text(defaults.get("sep"), "/") or "/"
        rows.append({
            "name": name,
            "outpost": _text(item.get("outpost")),
            "state": state,
            "implementation": implementation,
            "max_sessions": _int(item.get("max_sessions", defaults.get("max_sessions", 1)), label + ": max_sessions"),
            "workdir": _text(item.get("workdir")) or "{0}{1}{2}".format(defaults.get("workdir_root", ""), sep, name),
            "data_dir": "{0}{1}{2}".format(defaults.get("data_dir", ""), sep, name),
            "drain_timeout": _int(item.get("drain_timeout", defaults.get("drain_timeout", 30)), label + ": drain_timeout"),
            "acceptor_id": _text(item.get("acceptor_id")),
            "env": env,
            "api_url": _text(item.get("api_url")) or _text(defaults.get("api_url")),
            "has_token": has_token,
            "extra_args": extra_args,
            "fleet_size": _fleet_size(item, defaults, implementation, label),
        })
    return rows


def _fleet_size(item, defaults, implementation, label):
    """How many workers start together on the instance's outpost (``--fleet-size``; 0: not said).

    Only the bundled worker knows the option: the role's default leaves the official CLI's instances out, and
    an instance of the official CLI that sets its own is refused rather than silently ignored.
    """
    own = item.get("fleet_size")
    if implementation != "bundled":
        if own not in (None, 0, "0", ""):
            raise AnsibleFilterError("{0}: fleet_size is an option of the bundled worker, not of devin_cli".format(label))
        return 0
    size = _int(defaults.get("fleet_size", 0) if own is None else own, label + ": fleet_size")
    if size < 0:
        raise AnsibleFilterError("{0}: fleet_size must be 0 (not said) or more, got {1}".format(label, size))
    return size


def worker_instance_dirs(instances):
    """One row per directory an instance needs: ``{"path", "private"}`` (the data dir is private)."""
    rows = []
    for instance in instances:
        rows.append({"path": instance["data_dir"], "private": True, "instance": instance["name"]})
        rows.append({"path": instance["workdir"], "private": False, "instance": instance["name"]})
    return rows


def worker_instance_leftovers(instances, systemd_dir, unit, config_dir, remove_workdir=True):
    """The paths that belong to instances being removed: drop-in dir, env file, token file, data dir, workdir."""
    paths = []
    for instance in instances:
        paths.append("{0}/{1}{2}.service.d".format(systemd_dir, unit, instance["name"]))
        paths.append("{0}/{1}.env".format(config_dir, instance["name"]))
        paths.append("{0}/{1}.token".format(config_dir, instance["name"]))
        paths.append(instance["data_dir"])
        if remove_workdir:
            paths.append(instance["workdir"])
    return paths


def worker_token_files(instances, listed, default_token, config_dir):
    """One row ``{"name", "path", "token"}`` per bundled instance of ``instances`` (resolved, present): its token
    file ``<config_dir>/<name>.token`` and the token it holds, the instance's own ``token`` from ``listed``
    (``devin_outposts_worker_instances`` as given) or else ``default_token``.

    The rows hold tokens: they are for a ``no_log`` task only (the role's shared ``token`` entry point). The
    instances of the official CLI get none: that CLI reads its token from its environment file.
    """
    own = {}
    for item in listed or []:
        if isinstance(item, dict) and item.get("token"):
            own[_text(item.get("name"))] = _text(item["token"])
    rows = []
    for instance in instances:
        if instance["implementation"] != "bundled":
            continue
        rows.append({
            "name": instance["name"],
            "path": "{0}/{1}.token".format(config_dir, instance["name"]),
            "token": own.get(instance["name"]) or _text(default_token),
        })
    return rows


def worker_outpost_checks(results):
    """Rows ``{"name", "outpost", "found", "platform"}`` from the registered ``outpost_info`` loop."""
    rows = []
    for result in results or []:
        if "outposts" not in result:  # skipped, or failed and ignored
            continue
        outposts = result["outposts"]
        found = len(outposts) > 0
        platform = None
        if found:
            platform = (outposts[0].get("spec") or {}).get("platform")
        rows.append({
            "name": result["item"]["name"],
            "outpost": result["item"]["outpost"],
            "found": found,
            "platform": platform,
        })
    return rows


def worker_pip_argv(target, venv, wheelhouse="", index_url="", extra_index_urls=None, cert="", reinstall=False):
    """The argv that installs ``target`` (a wheel path or a requirement) into the venv ``venv``.

    A wheelhouse means an air-gapped install (``--no-index --find-links``), which excludes the indexes;
    ``reinstall`` forces the same version in again (a rebuilt wheel) without touching its dependencies.
    """
    if not target or not isinstance(target, str):
        raise AnsibleFilterError("worker_pip_argv needs the wheel or requirement to install")
    argv = [venv + "/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    if wheelhouse:
        argv += ["--no-index", "--find-links", wheelhouse]
    else:
        if index_url:
            argv += ["--index-url", index_url]
        argv += ["--extra-index-url=" + url for url in (extra_index_urls or [])]
    if cert:
        argv += ["--cert", cert]
    if reinstall:
        argv += ["--force-reinstall", "--no-deps"]
    argv.append(target)
    return argv


def worker_exec_args(args):
    """``args`` as one string for a systemd ``ExecStart=`` line: each argument in double quotes, with ``\\``
    and ``"`` escaped (systemd.syntax(7)), ``$`` doubled (no variable expansion) and ``%`` doubled (no
    specifier). Empty for no arguments."""
    parts = []
    for arg in _extra_args(args, "extra_args"):
        quoted = arg.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
        parts.append('"{0}"'.format(quoted))
    return " ".join(parts)


_DROPIN_WORKDIR = re.compile(r"^WorkingDirectory=(.*)$", re.MULTILINE)


def worker_host_instances(slurped, unit):
    """The instances installed on a host: ``{"name", "workdir"}`` per drop-in directory found.

    ``slurped`` is the registered result of an ``ansible.builtin.slurp`` loop over the drop-in directories'
    ``10-devin-outposts.conf`` (``item`` is the ``find`` row of the directory); ``workdir`` is empty when the
    drop-in could not be read.
    """
    rows = []
    for result in slurped or []:
        path = _text((result.get("item") or {}).get("path"))
        base = path.rstrip("/").rsplit("/", 1)[-1]
        if not (base.startswith(unit) and base.endswith(".service.d")):
            continue
        name = base[len(unit):-len(".service.d")]
        if not name:
            continue
        workdir = ""
        if result.get("content"):
            text = to_text(base64.b64decode(result["content"]))
            found = _DROPIN_WORKDIR.search(text)
            if found:
                workdir = found.group(1).strip()
        rows.append({"name": name, "workdir": workdir})
    return rows


def worker_outposts_to_create(hosts):
    """``{"name", "platform"}`` for every outpost named by the hosts' started or stopped instances.

    ``hosts`` are the play's hostvars; an outpost given by id (``outpost_env-...``) already exists. The platform is
    ``windows`` for hosts whose facts say Windows, ``linux`` otherwise. One outpost wanted on two platforms fails:
    an outpost serves one platform.
    """
    platforms = {}
    for host in hosts or []:
        facts = host.get("ansible_facts") or {}
        platform = "windows" if facts.get("os_family") == "Windows" else "linux"
        for instance in host.get("_devin_outposts_worker_present") or []:
            outpost = _text(instance.get("outpost"))
            if not outpost or outpost.startswith("outpost_env-"):
                continue
            if platforms.setdefault(outpost, platform) != platform:
                raise AnsibleFilterError(
                    "outpost {0} is wanted by Linux and by Windows hosts; an outpost serves one platform: give the "
                    "Windows instances an outpost of their own".format(outpost)
                )
    return [{"name": name, "platform": platforms[name]} for name in sorted(platforms)]


class FilterModule(object):
    def filters(self):
        return {
            "worker_instances": worker_instances,
            "worker_instance_dirs": worker_instance_dirs,
            "worker_instance_leftovers": worker_instance_leftovers,
            "worker_token_files": worker_token_files,
            "worker_outpost_checks": worker_outpost_checks,
            "worker_pip_argv": worker_pip_argv,
            "worker_exec_args": worker_exec_args,
            "worker_host_instances": worker_host_instances,
            "worker_outposts_to_create": worker_outposts_to_create,
        }
