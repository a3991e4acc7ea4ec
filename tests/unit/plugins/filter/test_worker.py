# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.devin.outposts.plugins.filter.worker import (
    FilterModule,
    worker_exec_args,
    worker_host_instances,
    worker_instance_dirs,
    worker_instance_leftovers,
    worker_instances,
    worker_outpost_checks,
    worker_pip_argv,
    worker_token_files,
)

DEFAULTS = {
    "max_sessions": "1",
    "drain_timeout": "30",
    "workdir_root": "/srv/devin-outposts",
    "data_dir": "/var/lib/devin-outposts",
    "env": {"A": "1", "B": "2"},
    "api_url": "https://api.devin.ai",
    "has_token": "False",
}


def test_every_filter_is_registered():
    assert sorted(FilterModule().filters()) == [
        "worker_exec_args",
        "worker_host_instances",
        "worker_instance_dirs",
        "worker_instance_leftovers",
        "worker_instances",
        "worker_outpost_checks",
        "worker_outposts_to_create",
        "worker_pip_argv",
        "worker_token_files",
    ]


def test_defaults_are_filled_in():
    rows = worker_instances([{"name": "w1", "outpost": "rhel"}], DEFAULTS)
    assert rows == [{
        "name": "w1",
        "outpost": "rhel",
        "state": "started",
        "implementation": "bundled",
        "max_sessions": 1,
        "workdir": "/srv/devin-outposts/w1",
        "data_dir": "/var/lib/devin-outposts/w1",
        "drain_timeout": 30,
        "acceptor_id": "",
        "env": {"A": "1", "B": "2"},
        "api_url": "https://api.devin.ai",
        "has_token": False,
        "extra_args": [],
        "fleet_size": 0,
    }]


def test_an_instance_overrides_the_defaults_and_its_env_wins():
    item = {
        "name": "w2", "outpost": "outpost_env-1", "state": "stopped", "implementation": "devin_cli",
        "max_sessions": 3, "workdir": "/data/w2", "drain_timeout": 5, "acceptor_id": "w2-id",
        "env": {"B": "own", "C": "3"}, "api_url": "http://sim:8787", "token": "cog_secret_token_value",
    }
    (row,) = worker_instances([item], DEFAULTS)
    assert row["state"] == "stopped" and row["implementation"] == "devin_cli"
    assert (row["max_sessions"], row["drain_timeout"], row["workdir"]) == (3, 5, "/data/w2")
    assert row["env"] == {"A": "1", "B": "own", "C": "3"}
    assert row["api_url"] == "http://sim:8787"
    assert row["has_token"] is True
    assert "cog_secret_token_value" not in repr(row)  # tokens never come out
    assert DEFAULTS["env"] == {"A": "1", "B": "2"}  # the defaults were not changed in place


@pytest.mark.parametrize("has_token, expected", [("True", True), (True, True), ("false", False), ("", False)])
def test_the_default_token_counts_when_set(has_token, expected):
    (row,) = worker_instances([{"name": "w", "outpost": "o"}], dict(DEFAULTS, has_token=has_token))
    assert row["has_token"] is expected


@pytest.mark.parametrize("item, message", [
    ({"name": "w", "outpost": "o", "tokne": "x"}, "instance w: unknown key(s) tokne"),
    ({"name": "w", "state": "running"}, "instance w: state must be one of started, stopped, absent"),
    ({"name": "w", "implementation": "docker"}, "implementation must be one of bundled, devin_cli"),
    ({"name": "w", "max_sessions": "many"}, "instance w: max_sessions must be an integer"),
    ({"name": "w", "env": ["A=1"]}, "instance w: env must be a dict"),
    ({"name": "w", "fleet_size": "lots"}, "instance w: fleet_size must be an integer"),
    ({"name": "w", "fleet_size": -3}, "instance w: fleet_size must be 0 (not said) or more, got -3"),
    ({"name": "w", "implementation": "devin_cli", "fleet_size": 50}, "fleet_size is an option of the bundled worker"),
    ("w", "devin_outposts_worker_instances[0] must be a dict"),
])
def test_bad_items_fail_with_one_line(item, message):
    with pytest.raises(AnsibleFilterError) as caught:
        worker_instances([item], DEFAULTS)
    assert message in str(caught.value)


def test_the_fleet_size_comes_from_the_instance_else_the_default_and_never_to_the_official_cli():
    rows = worker_instances([
        {"name": "a", "outpost": "o"},
        {"name": "b", "outpost": "o", "fleet_size": "7"},
        {"name": "c", "outpost": "o", "implementation": "devin_cli"},
        {"name": "d", "outpost": "o", "implementation": "devin_cli", "fleet_size": 0},
    ], dict(DEFAULTS, fleet_size="200"))
    assert [row["fleet_size"] for row in rows] == [200, 7, 0, 0]


def test_the_instances_must_be_a_list():
    with pytest.raises(AnsibleFilterError, match="must be a list"):
        worker_instances({"name": "w"}, DEFAULTS)


def test_directories_and_leftovers():
    rows = worker_instances([{"name": "a", "outpost": "o"}, {"name": "b", "outpost": "o", "workdir": "/w/b"}], DEFAULTS)
    assert worker_instance_dirs(rows) == [
        {"path": "/var/lib/devin-outposts/a", "private": True, "instance": "a"},
        {"path": "/srv/devin-outposts/a", "private": False, "instance": "a"},
        {"path": "/var/lib/devin-outposts/b", "private": True, "instance": "b"},
        {"path": "/w/b", "private": False, "instance": "b"},
    ]
    args = ("/etc/systemd/system", "devin-outposts-worker@", "/etc/devin-outposts")
    assert worker_instance_leftovers(rows[:1], *args) == [
        "/etc/systemd/system/devin-outposts-worker@a.service.d",
        "/etc/devin-outposts/a.env",
        "/etc/devin-outposts/a.token",
        "/var/lib/devin-outposts/a",
        "/srv/devin-outposts/a",
    ]
    assert "/srv/devin-outposts/a" not in worker_instance_leftovers(rows[:1], *args, remove_workdir=False)


def test_token_files_of_the_bundled_instances_with_their_own_token_or_the_default():
    listed = [
        {"name": "a", "outpost": "o"},
        {"name": "b", "outpost": "o", "token": "own-b"},
        {"name": "c", "outpost": "o", "token": ""},
        {"name": "cli", "outpost": "o", "implementation": "devin_cli", "token": "own-cli"},
    ]
    rows = worker_instances(listed, dict(DEFAULTS, has_token=True))
    assert worker_token_files(rows, listed, "default", "/etc/devin-outposts") == [
        {"name": "a", "path": "/etc/devin-outposts/a.token", "token": "default"},
        {"name": "b", "path": "/etc/devin-outposts/b.token", "token": "own-b"},
        {"name": "c", "path": "/etc/devin-outposts/c.token", "token": "default"},
    ]
    assert worker_token_files([], listed, "default", "/etc/devin-outposts") == []


def test_outpost_checks_summarise_the_lookups():
    results = [
        {"item": {"name": "a", "outpost": "rhel"}, "outposts": [{"spec": {"platform": "linux"}}]},
        {"item": {"name": "b", "outpost": "gone"}, "outposts": []},
        {"item": {"name": "c", "outpost": "dflt"}, "outposts": [{"spec": {"platform": None}}]},
        {"item": {"name": "d", "outpost": "x"}, "skipped": True},
    ]
    assert worker_outpost_checks(results) == [
        {"name": "a", "outpost": "rhel", "found": True, "platform": "linux"},
        {"name": "b", "outpost": "gone", "found": False, "platform": None},
        {"name": "c", "outpost": "dflt", "found": True, "platform": None},
    ]


def test_pip_argv_from_an_index():
    argv = worker_pip_argv("devin-outposts==0.2.0", "/opt/v", index_url="https://pypi.example/simple",
                           extra_index_urls=["https://extra.example/simple"], cert="/etc/ca.pem")
    assert argv == [
        "/opt/v/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
        "--index-url", "https://pypi.example/simple", "--extra-index-url=https://extra.example/simple",
        "--cert", "/etc/ca.pem", "devin-outposts==0.2.0",
    ]


def test_pip_argv_from_a_wheelhouse_ignores_the_indexes():
    argv = worker_pip_argv("/opt/w/x.whl", "/opt/v", wheelhouse="/opt/wh", index_url="https://i",
                           extra_index_urls=["https://e"], reinstall=True)
    assert argv == [
        "/opt/v/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
        "--no-index", "--find-links", "/opt/wh", "--force-reinstall", "--no-deps", "/opt/w/x.whl",
    ]


def test_pip_argv_needs_a_target():
    with pytest.raises(AnsibleFilterError, match="needs the wheel or requirement"):
        worker_pip_argv("", "/opt/v")


def test_extra_args_global_then_own():
    rows = worker_instances([{"name": "w", "outpost": "o", "extra_args": ["--log-level", "debug"]}],
                            dict(DEFAULTS, extra_args=["--no-watch"]))
    assert rows[0]["extra_args"] == ["--no-watch", "--log-level", "debug"]


@pytest.mark.parametrize("arg", ["--token", "--token=s3cret", "--tok", "--t=x", "--toke=x"])
def test_extra_args_refuse_the_token_and_its_prefixes(arg):
    with pytest.raises(AnsibleFilterError, match="would put the token on the command line"):
        worker_instances([{"name": "w", "outpost": "o", "extra_args": [arg]}], DEFAULTS)
    with pytest.raises(AnsibleFilterError, match="would put the token on the command line"):
        worker_instances([{"name": "w", "outpost": "o"}], dict(DEFAULTS, extra_args=[arg]))


@pytest.mark.parametrize("value", ["--no-watch", ["a\nb"], [{"a": 1}]])
def test_extra_args_must_be_a_list_of_one_line_strings(value):
    with pytest.raises(AnsibleFilterError):
        worker_instances([{"name": "w", "outpost": "o", "extra_args": value}], DEFAULTS)


def test_exec_args_are_quoted_for_systemd():
    assert worker_exec_args([]) == ""
    assert worker_exec_args(["--poll-interval-secs", 2]) == '"--poll-interval-secs" "2"'
    assert worker_exec_args(['a b', 'say "hi"', "back\\slash", "$HOME", "100%"]) == (
        '"a b" "say \\"hi\\"" "back\\\\slash" "$$HOME" "100%%"'
    )
    with pytest.raises(AnsibleFilterError, match="token"):
        worker_exec_args(["--token=x"])


def test_host_instances_from_the_drop_ins():
    def slurped(name, content=None):
        row = {"item": {"path": "/etc/systemd/system/devin-outposts-worker@{0}.service.d".format(name)}}
        if content is not None:
            row["content"] = base64.b64encode(content.encode()).decode()
        return row

    results = [
        slurped("a", "[Service]\nWorkingDirectory=/data/a\nExecStart=x\n"),
        slurped("b"),  # unreadable drop-in: the default workdir applies later
        {"item": {"path": "/etc/systemd/system/devin-outposts-worker@.service.d"}},  # the template's own
    ]
    assert worker_host_instances(results, "devin-outposts-worker@") == [
        {"name": "a", "workdir": "/data/a"},
        {"name": "b", "workdir": ""},
    ]
